// A container's OCI bundle config (config.json), as its runtime wrote it:
// the command, working directory and environment its process was started
// with, and the annotations its runtime set (containerd's CRI plugin names
// the image in `io.kubernetes.cri.image-name`). A rootfs capture records the
// command and the image from it; a rootfs restore compares images and takes
// the placeholder's environment (the pod's) from it.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "gpusnap/status.h"

namespace gpusnap::container {

inline constexpr const char* kImageNameAnnotation = "io.kubernetes.cri.image-name";
inline constexpr const char* kImageIdAnnotation = "io.kubernetes.cri.image-id";

struct BundleConfig {
  std::string path;                   // where it was read
  std::vector<std::string> args;      // process.args
  std::string cwd;                    // process.cwd ("/" where absent)
  std::vector<std::string> env;       // process.env
  std::map<std::string, std::string> annotations;
  std::string image() const;          // the image-name annotation, or ""
  std::string image_id() const;       // the image-id annotation, or ""
};

// Pure. kCorruption naming `where` for what is no OCI config: not a JSON
// object, or process.args missing, empty or not strings.
Result<BundleConfig> ParseBundleConfig(std::string_view text, std::string_view where);

// The config.json of the container whose init is host pid `init`: its
// runtime's shim (containerd's, CRI-O's conmon) is the init's parent and runs
// in the bundle directory. kNotFound naming the pid where there is none there.
Result<BundleConfig> ReadContainerBundle(pid_t init);

}  // namespace gpusnap::container
