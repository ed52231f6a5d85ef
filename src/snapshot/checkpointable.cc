#include "snapshot/checkpointable.h"

#include <fmt/format.h>

#include <set>
#include <string_view>

#include "net/tcp_ports.h"
#include "proc/proc.h"

namespace gpusnap {
namespace {

struct Unsupported {
  std::string_view link;  // as /proc shows the file, in fd/ and in maps
  std::string_view what;
  std::string_view advice;
};

constexpr Unsupported kUnsupported[] = {
    {"anon_inode:[io_uring]", "an io_uring instance",
     "libuv (PyTorch's TCPStore, torchrun) falls back to epoll when io_uring is refused, which the gpushare shim "
     "does: start the workload with `gpusnap run --gpushare`"},
};

std::string Command(const ProcessFiles& p) {
  if (p.cmdline.empty()) return "?";
  std::string out = p.cmdline.front();
  for (size_t i = 1; i < p.cmdline.size() && out.size() < 80; ++i) out += " " + p.cmdline[i];
  return out;
}

}  // namespace

Status CheckCheckpointable(const std::vector<ProcessFiles>& tree) {
  for (const ProcessFiles& p : tree) {
    for (const Unsupported& u : kUnsupported) {
      std::string where;
      for (const auto& [fd, link] : p.fds)
        if (link == u.link) where = fmt::format("fd {}", fd);
      if (where.empty())
        for (const auto& path : p.mapped)
          if (path == u.link) where = "mapped, its fd closed";
      if (where.empty()) continue;
      return Status::Error(Code::kFailedPrecondition,
                           "pid {} (`{}`) holds {} ({}), which CRIU cannot checkpoint; nothing was changed. {}", p.pid,
                           Command(p), u.what, where, u.advice);
    }
  }
  return Status::Ok();
}

std::vector<ProcessFiles> ReadProcessFiles(const std::vector<pid_t>& tree) {
  std::vector<ProcessFiles> files;
  for (pid_t pid : tree) files.push_back({pid, proc::Cmdline(pid), proc::OpenFiles(pid), proc::MappedPaths(pid)});
  return files;
}

std::vector<uint16_t> TreeListeningPorts(const std::vector<ProcessFiles>& tree) {
  if (tree.empty()) return {};
  std::set<uint64_t> inodes;
  for (const ProcessFiles& p : tree)
    for (const auto& [fd, link] : p.fds)
      if (std::optional<uint64_t> inode = net::SocketInode(link)) inodes.insert(*inode);
  return net::ListeningPortsOf(tree.front().pid, inodes);
}

}  // namespace gpusnap
