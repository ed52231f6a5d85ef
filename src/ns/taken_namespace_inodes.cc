#include "ns/taken_namespace_inodes.h"

#include <charconv>

namespace gpusnap::ns {

std::set<uint64_t> NamespaceInodesInCudaSocketNames(std::string_view proc_net_unix) {
  // Each line's last field is the path, `@`-prefixed for an abstract name;
  // the driver's name is `@cuda-uvmfd-<inode>-<pid>@`.
  constexpr std::string_view kPrefix = "@cuda-uvmfd-";
  std::set<uint64_t> inodes;
  size_t start = 0;
  while (start < proc_net_unix.size()) {
    size_t end = proc_net_unix.find('\n', start);
    if (end == std::string_view::npos) end = proc_net_unix.size();
    std::string_view line = proc_net_unix.substr(start, end - start);
    start = end + 1;
    size_t at = line.rfind(' ');
    std::string_view name = at == std::string_view::npos ? line : line.substr(at + 1);
    if (!name.starts_with(kPrefix)) continue;
    name.remove_prefix(kPrefix.size());
    uint64_t inode = 0;
    auto [next, ec] = std::from_chars(name.data(), name.data() + name.size(), inode);
    if (ec != std::errc() || next == name.data() + name.size() || *next != '-') continue;
    inodes.insert(inode);
  }
  return inodes;
}

}  // namespace gpusnap::ns
