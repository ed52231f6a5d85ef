// CRIU's log of a failed dump, kept where the user can read it: the snapshot's
// temporary directory, which holds it while CRIU runs, goes with the failure.
#pragma once

#include <string>

#include "gpusnap/status.h"

namespace gpusnap {

// Copies `log_path` to <store>/logs/<id>.dump.log and returns `failure` with
// the log's path in its message replaced by the kept copy's. When the copy
// cannot be made, `failure` is returned as it is (it names the original).
Status KeepDumpLog(const std::string& store_root, const std::string& id, const std::string& log_path,
                   const Status& failure);

}  // namespace gpusnap
