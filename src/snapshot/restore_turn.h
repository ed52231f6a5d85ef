// Restores whose CRIU images hold deleted files take turns at CRIU's step;
// every other restore runs at once, taking no turn.
//
// Why: CRIU brings a deleted-but-open file back through a "ghost" at a name
// the images alone decide, <its path>.cr.<id>.ghost (criu/ghost_files.h). Two
// restores of one snapshot at once, or of two snapshots of one tree, meet
// there: "Can't create ghost regfile: File exists", "Couldn't unlink remap".
//
// Contract:
// - NeedsRestoreTurn: the images hold a ghost-file-<id>.img. Pure.
// - TakeRestoreTurn: a turn that NeedsRestoreTurn does not ask for is empty
//   (held() false, nothing waited for, no phase). Otherwise one turn per node
//   (per run directory) at a time: an exclusive flock on
//   <run dir>/locks/criu-ghosts.lock (a LockFile, util/lock_file.h), which
//   its holder names itself in (pid, snapshot). A restore that finds it held
//   says so once as a progress line ("wait-turn: waiting for ...") and waits,
//   up to `timeout` (kTimeout naming the holder after that). Phase
//   `wait-turn` (progress and timings) is the time it took, waited or not.
// - Held, no other restore makes ghosts here: a ghost these images would make
//   that exists already was left by a restore whose CRIU was killed (a
//   restore's namespace takes its CRIU with it when gpusnap is killed) and is
//   removed before this CRIU starts, each with a progress line.
// - The holder keeps the turn across CRIU's restore only, and hands fd() to
//   CRIU to inherit (criu::Operation::inherit_fds): a CRIU that outlives a
//   killed gpusnap (into a container) keeps the turn until it exits. Release
//   it once CRIU has exited; the tree CRIU restored holds no copy of it
//   (CRIU closes in each restored task every descriptor the images do not
//   name).
// Not thread-safe; one RestoreTurn per restore.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "gpusnap/progress.h"
#include "gpusnap/status.h"
#include "snapshot/phases.h"
#include "util/lock_file.h"

namespace gpusnap {

// The names of a CRIU image directory's files ask for a turn.
bool NeedsRestoreTurn(const std::vector<std::string>& image_names);

struct RestoreTurnSpec {
  std::string images_dir;   // CRIU's images
  std::string root;         // where the tree's paths are seen: /proc/<pid in its mount namespace>/root
  std::string snapshot_id;  // named to the restores that wait
  std::chrono::seconds timeout{600};
  ProgressFn progress;      // the waiting and the leftovers are told here; may be empty
};

class RestoreTurn {
 public:
  RestoreTurn() = default;
  bool held() const { return lock_.has_value(); }
  int fd() const { return lock_ ? lock_->fd() : -1; }
  void Release() { lock_.reset(); }

 private:
  friend Result<RestoreTurn> TakeRestoreTurn(const RestoreTurnSpec& spec, Phases& phases);
  std::optional<LockFile> lock_;
};

// kTimeout naming the holder when the turn stays taken; kIoError when the
// images cannot be listed or the lock file made.
Result<RestoreTurn> TakeRestoreTurn(const RestoreTurnSpec& spec, Phases& phases);

}  // namespace gpusnap
