#include "snapshot/capture_path.h"

#include <fmt/format.h>

namespace gpusnap {

Result<CaptureDecision> ChooseCapturePath(CapturePath requested, const Status& process_ok, const Status& rootfs_ok) {
  switch (requested) {
    case CapturePath::kProcess:
      if (!process_ok.ok()) return process_ok;
      return CaptureDecision{CapturePath::kProcess, "the process path was asked for"};
    case CapturePath::kRootfs:
      if (!rootfs_ok.ok()) return rootfs_ok.Wrap("the rootfs path was asked for");
      return CaptureDecision{CapturePath::kRootfs, "the rootfs path was asked for"};
    case CapturePath::kBoth:
      if (!process_ok.ok()) return process_ok.Wrap("both paths were asked for, and the process path is refused");
      if (!rootfs_ok.ok()) return rootfs_ok.Wrap("both paths were asked for, and the rootfs path is refused");
      return CaptureDecision{CapturePath::kBoth, "both paths were asked for"};
    case CapturePath::kAuto:
      break;
  }
  if (process_ok.ok()) return CaptureDecision{CapturePath::kProcess, "auto: the tree is checkpointable"};
  if (rootfs_ok.ok())
    return CaptureDecision{CapturePath::kRootfs,
                           fmt::format("auto: the process path is refused ({})", process_ok.message())};
  return Status::Error(process_ok.code(), "{}; nor can the rootfs path take it: {}", process_ok.message(),
                       rootfs_ok.message());
}

}  // namespace gpusnap
