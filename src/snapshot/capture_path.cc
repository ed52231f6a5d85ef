#include "snapshot/capture_path.h"

#include <fmt/format.h>

namespace gpusnap {

bool IsCapturePathName(std::string_view name) {
  return name == "auto" || name == "process" || name == "rootfs" || name == "both";
}

Result<CaptureDecision> ChooseCapturePath(std::string_view requested, const Status& process_ok,
                                          const Status& rootfs_ok) {
  if (!IsCapturePathName(requested))
    return Status::Error(Code::kInvalidArgument,
                         "capture path `{}` is none of auto, process, rootfs and both", requested);
  if (requested == "process") {
    if (!process_ok.ok()) return process_ok;
    return CaptureDecision{"process", "the process path was asked for"};
  }
  if (requested == "rootfs") {
    if (!rootfs_ok.ok()) return rootfs_ok.Wrap("the rootfs path was asked for");
    return CaptureDecision{"rootfs", "the rootfs path was asked for"};
  }
  if (requested == "both") {
    if (!process_ok.ok()) return process_ok.Wrap("both paths were asked for, and the process path is refused");
    if (!rootfs_ok.ok()) return rootfs_ok.Wrap("both paths were asked for, and the rootfs path is refused");
    return CaptureDecision{"both", "both paths were asked for"};
  }
  if (process_ok.ok()) return CaptureDecision{"process", "auto: the tree is checkpointable"};
  if (rootfs_ok.ok())
    return CaptureDecision{"rootfs", fmt::format("auto: the process path is refused ({})", process_ok.message())};
  return Status::Error(process_ok.code(), "{}; nor can the rootfs path take it: {}", process_ok.message(),
                       rootfs_ok.message());
}

}  // namespace gpusnap
