#include "store/origins.h"

#include <fcntl.h>
#include <unistd.h>

#include <sstream>

#include "util/fd.h"
#include "util/files.h"

namespace gpusnap {

std::string OriginsPath(const std::string& root, const std::string& id) { return root + "/origins/" + id; }

bool IsOrigin(const std::string& root, const std::string& id, const std::string& digest) {
  auto text = ReadFile(OriginsPath(root, id));
  if (!text.ok()) return false;
  std::istringstream lines(*text);
  for (std::string line; std::getline(lines, line);)
    if (line == digest) return true;
  return false;
}

Status AddOrigin(const std::string& root, const std::string& id, const std::string& digest) {
  if (IsOrigin(root, id, digest)) return Status::Ok();
  GPUSNAP_RETURN_IF_ERROR(MakeDirs(root + "/origins", 0700));
  std::string path = OriginsPath(root, id);
  // One short line appended at once: concurrent pushes of one snapshot interleave whole lines.
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) return Status::Errno(errno, "opening `{}`", path);
  return WriteAll(fd.get(), digest + "\n", path);
}

Status SetOrigin(const std::string& root, const std::string& id, const std::string& digest) {
  GPUSNAP_RETURN_IF_ERROR(MakeDirs(root + "/origins", 0700));
  return WriteFileAtomic(OriginsPath(root, id), digest + "\n", 0600);
}

}  // namespace gpusnap
