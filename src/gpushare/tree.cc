#include "gpushare/tree.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <future>
#include <thread>

#include "gpushare/chunk_manifest.h"
#include "gpushare/chunk_store.h"
#include "ns/proc.h"
#include "util/files.h"
#include "util/fd.h"

namespace gpusnap::gpushare {
namespace {

using Clock = std::chrono::steady_clock;
double SecondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Runs `fn` on every process at once; the statuses in order.
template <typename Fn>
std::vector<Status> OnEach(const std::vector<ShimProcess>& procs, Fn fn) {
  std::vector<std::future<Status>> futures;
  for (const ShimProcess& p : procs) futures.push_back(std::async(std::launch::async, [&fn, &p] { return fn(p); }));
  std::vector<Status> out;
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

Status FirstError(const std::vector<Status>& statuses) {
  for (const Status& st : statuses)
    if (!st.ok()) return st;
  return Status::Ok();
}

Status Command(const ShimProcess& p, ShimCommand c, const std::string& store = "", const std::string& manifest = "",
               int timeout_ms = 10000) {
  ControlRequest req;
  req.command = c;
  req.chunk_store = store;
  req.manifest = manifest;
  req.timeout_ms = timeout_ms;
  // Moving device memory takes as long as the bytes take: no tight deadline.
  int wait_ms = c == ShimCommand::kRelease || c == ShimCommand::kLoad ? 3600 * 1000 : timeout_ms + 30000;
  return Send(p, req, wait_ms).status();
}

using ManifestOf = std::function<std::string(const ShimProcess&)>;

// Quiesce all, then release all; on any failure every process is brought back.
Status QuiesceAndRelease(const std::vector<ShimProcess>& procs, const std::string& chunk_store,
                         const ManifestOf& manifest_of, int quiesce_timeout_ms, std::map<std::string, double>& timings) {
  auto t0 = Clock::now();
  std::vector<Status> quiesced = OnEach(procs, [&](const ShimProcess& p) {
    return Command(p, ShimCommand::kQuiesce, "", "", quiesce_timeout_ms);
  });
  timings["gpushare-quiesce"] = SecondsSince(t0);
  if (Status st = FirstError(quiesced); !st.ok()) {
    OnEach(procs, [&](const ShimProcess& p) { return Command(p, ShimCommand::kResume); });
    return st;
  }
  auto t1 = Clock::now();
  std::vector<Status> released = OnEach(procs, [&](const ShimProcess& p) {
    return Command(p, ShimCommand::kRelease, chunk_store, manifest_of(p));
  });
  timings["gpushare-release"] = SecondsSince(t1);
  if (Status st = FirstError(released); !st.ok()) {
    // A failed release rolled itself back; the others come back from their chunks.
    OnEach(procs, [&](const ShimProcess& p) {
      size_t i = static_cast<size_t>(&p - procs.data());
      if (released[i].ok()) GPUSNAP_RETURN_IF_ERROR(Command(p, ShimCommand::kLoad, chunk_store, manifest_of(p)));
      return Command(p, ShimCommand::kResume);
    });
    return st;
  }
  return Status::Ok();
}

// Load every released process (all of them, or only those the shim says are
// released), then resume every one.
Status LoadAndResume(const std::vector<ShimProcess>& procs, const std::string& chunk_store,
                     const ManifestOf& manifest_of, bool only_released, std::map<std::string, double>& timings) {
  auto t0 = Clock::now();
  std::vector<Status> loaded = OnEach(procs, [&](const ShimProcess& p) -> Status {
    if (only_released) {
      GPUSNAP_ASSIGN_OR_RETURN(auto state, Send(p, {ShimCommand::kState, "", "", 10000}, 30000));
      if (state.value("state", "") != "released") return Status::Ok();
    }
    return Command(p, ShimCommand::kLoad, chunk_store, manifest_of(p));
  });
  timings["gpushare-load"] = SecondsSince(t0);
  GPUSNAP_RETURN_IF_ERROR(FirstError(loaded));
  auto t1 = Clock::now();
  Status st = ResumeAll(procs);
  timings["gpushare-resume"] = SecondsSince(t1);
  return st;
}

}  // namespace

Result<bool> DecideShimUse(const std::vector<pid_t>& gpu_pids, const std::vector<bool>& maps_shim) {
  int with = -1, without = -1;
  for (size_t i = 0; i < gpu_pids.size() && i < maps_shim.size(); ++i) {
    if (maps_shim[i] && with < 0) with = gpu_pids[i];
    if (!maps_shim[i] && without < 0) without = gpu_pids[i];
  }
  if (with >= 0 && without >= 0)
    return Status::Error(Code::kFailedPrecondition,
                         "GPU process {} loads the gpushare shim but GPU process {} does not: a tree is checkpointed "
                         "with the shim in all its GPU processes or in none (start it with `gpusnap run --gpushare`)",
                         with, without);
  return with >= 0;
}

std::string MappedShimPath(pid_t pid) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(maps, line)) {
    auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    std::string path = line.substr(slash);
    if (path.size() >= std::strlen(kShimLibraryName) &&
        path.compare(path.size() - std::strlen(kShimLibraryName), std::string::npos, kShimLibraryName) == 0)
      return path;
  }
  return "";
}

// The name of the control socket `pid` listens on: from its own socket
// descriptors and its network namespace's unix socket table, because after a
// restore the name (made in the first pid namespace) no longer matches the
// namespace the process is in.
static std::string ListeningControlSocket(pid_t pid) {
  std::set<std::string> inodes;
  std::error_code ec;
  for (const auto& fd : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    std::string target = std::filesystem::read_symlink(fd.path(), ec).string();
    if (!ec && target.starts_with("socket:[")) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::ifstream table("/proc/" + std::to_string(pid) + "/net/unix");
  std::string line;
  const std::string prefix = "@gpusnap-gpushare.";
  while (std::getline(table, line)) {
    // Num RefCount Protocol Flags Type St Inode Path
    std::istringstream fields(line);
    std::string num, refs, protocol, flags, type, state, inode, path;
    if (!(fields >> num >> refs >> protocol >> flags >> type >> state >> inode >> path)) continue;
    if (inodes.count(inode) != 0 && path.starts_with(prefix)) return path.substr(1);
  }
  return "";
}

Result<std::vector<ShimProcess>> FindShimProcesses(const std::vector<pid_t>& gpu_pids) {
  std::vector<bool> maps;
  for (pid_t p : gpu_pids) maps.push_back(!MappedShimPath(p).empty());
  GPUSNAP_ASSIGN_OR_RETURN(bool use, DecideShimUse(gpu_pids, maps));
  std::vector<ShimProcess> out;
  if (!use) return out;
  return ShimProcessesOf(gpu_pids);
}

Result<nlohmann::json> Send(const ShimProcess& p, const ControlRequest& request, int timeout_ms) {
  auto fail = [&](int err, const char* what) {
    return Status::Errno(err, "gpushare `{}` of pid {}: {} control socket @{}", ShimCommandName(request.command), p.pid,
                         what, p.socket);
  };
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return fail(errno, "creating a socket for the");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (p.socket.size() + 2 > sizeof(addr.sun_path)) return Status::Error(Code::kInvalidArgument, "socket name too long");
  std::memcpy(addr.sun_path + 1, p.socket.data(), p.socket.size());
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + p.socket.size());
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) return fail(errno, "cannot reach its");
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  std::string line = FormatControlRequest(request);
  if (::send(fd.get(), line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size()))
    return fail(errno, "cannot write to its");
  std::string reply;
  char buf[4096];
  while (reply.find('\n') == std::string::npos) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return Status::Error(Code::kTimeout, "gpushare `{}` of pid {}: no answer within {} ms",
                           ShimCommandName(request.command), p.pid, timeout_ms);
    if (n < 0) return fail(errno, "cannot read from its");
    if (n == 0)
      return Status::Error(Code::kExternal, "gpushare `{}` of pid {}: the process closed its control socket",
                           ShimCommandName(request.command), p.pid);
    reply.append(buf, static_cast<size_t>(n));
  }
  auto parsed = ParseControlReply(reply.substr(0, reply.find('\n')));
  if (!parsed.ok())
    return parsed.status().Wrap(fmt::format("gpushare `{}` of pid {}", ShimCommandName(request.command), p.pid));
  return parsed;
}

std::string ManifestPath(const std::string& dir, const ShimProcess& p) {
  return fmt::format("{}/{}.chunks", dir, p.ns_pid);
}

Status ReleaseAll(const std::vector<ShimProcess>& procs, const std::string& chunk_store,
                  const std::string& manifest_dir, int quiesce_timeout_ms, std::map<std::string, double>& timings) {
  return QuiesceAndRelease(procs, chunk_store, [&](const ShimProcess& p) { return ManifestPath(manifest_dir, p); },
                           quiesce_timeout_ms, timings);
}

Status LoadAll(const std::vector<ShimProcess>& procs, const std::string& chunk_store, const std::string& manifest_dir,
               std::map<std::string, double>& timings) {
  return LoadAndResume(procs, chunk_store, [&](const ShimProcess& p) { return ManifestPath(manifest_dir, p); }, false,
                       timings);
}

Status CheckManifests(const std::string& chunk_store, const std::string& manifest_dir, const std::vector<int>& ns_pids) {
  for (int ns_pid : ns_pids) {
    std::string path = ManifestPath(manifest_dir, {0, ns_pid, ""});
    GPUSNAP_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
    GPUSNAP_ASSIGN_OR_RETURN(ChunkManifest manifest, DecodeChunkManifest(bytes, path));
    GPUSNAP_ASSIGN_OR_RETURN(ChunkStore store, ChunkStore::Open(chunk_store));
    for (const ChunkedAllocation& a : manifest.allocations) {
      for (const ChunkRef& ref : a.chunks) {
        if (ref.zero) continue;
        std::string chunk = store.ChunkPath(ref.digest);
        struct stat st{};
        if (::stat(chunk.c_str(), &st) != 0)
          return Status::Errno(errno, "chunk `{}` of allocation {:#x} (manifest `{}`)", chunk, a.va, path);
        if (static_cast<uint64_t>(st.st_size) != ref.length)
          return Status::Error(Code::kCorruption, "chunk `{}` has {} bytes, the manifest `{}` says {}", chunk,
                               st.st_size, path, ref.length);
      }
    }
  }
  return Status::Ok();
}

Result<std::vector<ShimProcess>> ShimProcessesOf(const std::vector<pid_t>& pids) {
  std::vector<ShimProcess> out;
  for (pid_t p : pids) {
    if (!proc::Exists(p)) return Status::Error(Code::kNotFound, "no process with pid {}", p);
    if (MappedShimPath(p).empty())
      return Status::Error(Code::kFailedPrecondition, "pid {} does not load the gpushare shim ({})", p, kShimLibraryName);
    GPUSNAP_ASSIGN_OR_RETURN(auto nspids, proc::NsPids(p));
    std::string socket = ListeningControlSocket(p);
    if (socket.empty())
      return Status::Error(Code::kFailedPrecondition,
                           "pid {} loads the gpushare shim but listens on no control socket (has it called cuInit? "
                           "see its log)",
                           p);
    out.push_back({p, nspids.back(), socket});
  }
  return out;
}

std::string SuspendedDir(const std::string& store, const ShimProcess& p) {
  return fmt::format("{}/suspended/{}", store, p.pid);
}

Status SuspendInPlace(const std::vector<ShimProcess>& procs, const std::string& store, int quiesce_timeout_ms,
                      std::map<std::string, double>& timings) {
  // Each process keeps its manifest in a directory of its own.
  for (const ShimProcess& p : procs) GPUSNAP_RETURN_IF_ERROR(MakeDirs(SuspendedDir(store, p), 0700));
  return QuiesceAndRelease(procs, store, [&](const ShimProcess& p) { return ManifestPath(SuspendedDir(store, p), p); },
                           quiesce_timeout_ms, timings);
}

Status ResumeInPlace(const std::vector<ShimProcess>& procs, const std::string& store,
                     std::map<std::string, double>& timings) {
  GPUSNAP_RETURN_IF_ERROR(LoadAndResume(
      procs, store, [&](const ShimProcess& p) { return ManifestPath(SuspendedDir(store, p), p); }, true, timings));
  for (const ShimProcess& p : procs) (void)RemoveTree(SuspendedDir(store, p));
  return Status::Ok();
}

Status ResumeAll(const std::vector<ShimProcess>& procs) {
  return FirstError(OnEach(procs, [&](const ShimProcess& p) { return Command(p, ShimCommand::kResume); }));
}

}  // namespace gpusnap::gpushare
