// Which capture path a checkpoint takes (docs/CAPTURE-PATHS.md, "The
// matrix"): the process (CRIU and the GPU state: a warm restore), the rootfs
// (the container's writable layer and caches: a cold start with warm caches),
// or both in one snapshot. Pure: the checkpoint's pre-checks find whether
// each path can run, this decides.
#pragma once

#include <string>
#include <string_view>

#include "gpusnap/snapshot.h"
#include "gpusnap/status.h"

namespace gpusnap {

struct CaptureDecision {
  CapturePath path = CapturePath::kProcess;  // kProcess, kRootfs or kBoth
  std::string reason;  // why: a sentence for the job, the snapshot and the pod
};

// `process_ok`: the process path's pre-check (CheckCheckpointable: Ok, or why
// CRIU cannot take the tree). `rootfs_ok`: the rootfs path's (Ok when the
// container's root is an overlay with a writable layer, else why not).
//   auto    -> process when process_ok, else rootfs when rootfs_ok (the
//              reason quotes the process refusal), else the process refusal
//              with the rootfs one appended;
//   process -> process_ok's refusal as it is, or process;
//   rootfs  -> rootfs_ok's refusal, or rootfs;
//   both    -> either refusal (naming the path), or both.
Result<CaptureDecision> ChooseCapturePath(CapturePath requested, const Status& process_ok, const Status& rootfs_ok);

}  // namespace gpusnap
