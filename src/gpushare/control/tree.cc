#include "gpushare/control/tree.h"

#include <linux/kcmp.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string_view>
#include <sstream>
#include <future>
#include <thread>

#include "chunks/chunk_lock.h"
#include "chunks/chunk_manifest.h"
#include "chunks/chunk_store.h"
#include "gpushare/common/control_client.h"
#include "proc/proc.h"
#include "util/files.h"
#include "util/fd.h"
#include "util/test_hooks.h"

namespace gpusnap::gpushare::control {
namespace {

using Clock = std::chrono::steady_clock;
double SecondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Runs `fn` on every process at once; the statuses in order. With a phase
// name, each process's own time goes into `timings` as "<phase>.pid<ns pid>":
// the slowest rank sets the phase's time, and these say which one it was.
template <typename Fn>
std::vector<Status> OnEach(const std::vector<ShimProcess>& procs, Fn fn,
                           std::map<std::string, double>* timings = nullptr, const char* phase = nullptr) {
  std::vector<double> seconds(procs.size(), 0);
  std::vector<std::future<Status>> futures;
  for (size_t i = 0; i < procs.size(); ++i)
    futures.push_back(std::async(std::launch::async, [&fn, &procs, &seconds, i] {
      auto t0 = Clock::now();
      Status st = fn(procs[i]);
      seconds[i] = SecondsSince(t0);
      return st;
    }));
  std::vector<Status> out;
  for (auto& f : futures) out.push_back(f.get());
  if (timings != nullptr && procs.size() > 1)
    for (size_t i = 0; i < procs.size(); ++i) (*timings)[fmt::format("{}.pid{}", phase, procs[i].ns_pid)] = seconds[i];
  return out;
}

Status FirstError(const std::vector<Status>& statuses) {
  for (const Status& st : statuses)
    if (!st.ok()) return st;
  return Status::Ok();
}

// Moving device memory takes as long as the bytes take: no tight deadline.
constexpr int kMovingMemoryWaitMs = 3600 * 1000;

// What the processes' releases did, summed into the timings beside their
// seconds: the chunks copied off the GPU and those found unchanged since they
// were stored (counts), and the slowest fingerprinting (seconds).
void AddReleaseFigures(const std::vector<nlohmann::json>& figures, std::map<std::string, double>& timings) {
  double copied = 0, unchanged = 0, fingerprint_s = 0;
  for (const nlohmann::json& f : figures) {
    if (!f.is_object()) continue;  // a process whose release failed
    copied += f.value("chunks_copied", 0.0);
    unchanged += f.value("chunks_unchanged", 0.0);
    fingerprint_s = std::max(fingerprint_s, f.value("fingerprint_s", 0.0));
  }
  timings["gpushare-chunks-copied"] = copied;
  timings["gpushare-chunks-unchanged"] = unchanged;
  timings["gpushare-fingerprint"] = fingerprint_s;
}

Status Command(const ShimProcess& p, ShimCommand c, const std::string& store = "", const std::string& manifest = "",
               int timeout_ms = 10000) {
  ControlRequest req;
  req.command = c;
  req.chunk_store = store;
  req.manifest = manifest;
  req.timeout_ms = timeout_ms;
  int wait_ms = c == ShimCommand::kRelease || c == ShimCommand::kLoad ? kMovingMemoryWaitMs : timeout_ms + 30000;
  return Send(p, req, wait_ms).status();
}

using ManifestOf = std::function<std::string(const ShimProcess&)>;

bool KcmpSameFile(pid_t a, int fd_a, pid_t b, int fd_b) {
  return ::syscall(SYS_kcmp, a, b, KCMP_FILE, fd_a, fd_b) == 0;
}

// Before a release: whose memory each process imported, written beside its
// manifest for the remap after the load.
Status RecordShares(const std::vector<ShimProcess>& procs, const ManifestOf& manifest_of) {
  std::vector<ProcessSharing> sharing;
  bool any = false;
  for (const ShimProcess& p : procs) {
    GPUSNAP_ASSIGN_OR_RETURN(auto state, Send(p, {ShimCommand::kState, "", "", 10000}, 30000));
    sharing.push_back(SharingFromState(state));
    any = any || !sharing.back().imports.empty();
  }
  if (!any) return Status::Ok();
  GPUSNAP_ASSIGN_OR_RETURN(auto shares, MatchShares(procs, sharing, [&](size_t ia, int a, size_t ib, int b) {
                             return KcmpSameFile(procs[ia].pid, a, procs[ib].pid, b);
                           }));
  for (size_t i = 0; i < procs.size(); ++i) {
    if (shares[i].empty()) continue;
    GPUSNAP_RETURN_IF_ERROR(WriteFileAtomic(SharesPath(manifest_of(procs[i])), EncodeShares(shares[i])));
  }
  return Status::Ok();
}

// After every process has loaded: each import mapped again from a new fd of
// its exporter's memory, passed through gpusnap.
Status RemapShares(const std::vector<ShimProcess>& procs, const ManifestOf& manifest_of) {
  for (const ShimProcess& p : procs) {
    std::string path = SharesPath(manifest_of(p));
    if (::access(path.c_str(), F_OK) != 0) continue;
    GPUSNAP_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
    GPUSNAP_ASSIGN_OR_RETURN(std::vector<Share> shares, DecodeShares(text, path));
    for (const Share& share : shares) {
      const ShimProcess* exporter = nullptr;
      for (const ShimProcess& q : procs) {
        if (q.ns_pid != share.exporter_ns_pid) continue;
        if (exporter != nullptr)
          return Status::Error(Code::kFailedPrecondition,
                               "remap of pid {}: two processes have pid {} in their namespaces; cannot tell which "
                               "exported its memory",
                               p.pid, share.exporter_ns_pid);
        exporter = &q;
      }
      if (exporter == nullptr)
        return Status::Error(Code::kNotFound, "remap of pid {}: its memory came from pid {} (in its namespace), which is "
                                              "not among the processes",
                             p.pid, share.exporter_ns_pid);
      ControlRequest exp{ShimCommand::kExport, "", "", 10000, share.object};
      UniqueFd fd;
      GPUSNAP_RETURN_IF_ERROR(Send(*exporter, exp, 30000, -1, &fd).status());
      if (!fd.valid())
        return Status::Error(Code::kExternal, "gpushare `export` of pid {}: no fd came with the reply", exporter->pid);
      ControlRequest remap{ShimCommand::kRemap, "", "", 10000, share.import};
      GPUSNAP_RETURN_IF_ERROR(Send(p, remap, 60000, fd.get()).status());
    }
  }
  return Status::Ok();
}

// While quiesced: an fd of each shim allocation of each process.
HeldMemory HoldMemory(const std::vector<ShimProcess>& procs) {
  HeldMemory held;
  for (const ShimProcess& p : procs) {
    auto state = Send(p, {ShimCommand::kState, "", "", 10000}, 30000);
    if (!state.ok() || !state->contains("shim_allocations")) continue;
    for (const auto& a : (*state)["shim_allocations"]) {
      PreloadedAllocation got;
      got.va = a.value("va", uint64_t{0});
      got.size = a.value("size", uint64_t{0});
      ControlRequest exp{ShimCommand::kExport, "", "", 10000, got.va};
      // One that cannot be exported (memory made without a POSIX-fd handle)
      // is loaded back from its chunks, as without holding.
      if (!Send(p, exp, 30000, -1, &got.fd).ok() || !got.fd.valid()) continue;
      ++held.allocations;
      held.bytes += got.size;
      held.by_pid[p.ns_pid].push_back(std::move(got));
    }
  }
  return held;
}

// Quiesce all, then release all; on any failure every process is brought back.
Status QuiesceAndRelease(const std::vector<ShimProcess>& procs, const std::string& chunk_store,
                         const ManifestOf& manifest_of, int quiesce_timeout_ms, std::map<std::string, double>& timings,
                         HeldMemory* hold = nullptr) {
  auto t0 = Clock::now();
  // Processes that work together (a collective) can only all stop between
  // two pieces of work: a process caught inside one waits for a peer already
  // held, which shows within milliseconds. Several processes get short
  // attempts (growing, for work that is merely long), resumed between, until
  // the timeout is spent.
  auto deadline = t0 + std::chrono::milliseconds(quiesce_timeout_ms);
  Status st;
  for (int attempt = 1;; ++attempt) {
    int attempt_ms = procs.size() > 1 ? QuiesceAttemptMs(attempt, quiesce_timeout_ms) : quiesce_timeout_ms;
    st = FirstError(OnEach(procs, [&](const ShimProcess& p) {
      return Command(p, ShimCommand::kQuiesce, "", "", attempt_ms);
    }));
    if (st.ok() || st.code() != Code::kTimeout || Clock::now() + std::chrono::milliseconds(attempt_ms) > deadline)
      break;
    if (Status resumed = ResumeAll(procs); !resumed.ok())
      return st.Then("resuming the processes between two attempts", resumed);
    // A pause of varying length, so the next attempt lands elsewhere in the work's rhythm.
    std::this_thread::sleep_for(std::chrono::milliseconds(5 + 17 * (attempt % 7)));
    timings["gpushare-quiesce-retries"] = attempt;
  }
  timings["gpushare-quiesce"] = SecondsSince(t0);
  if (st.ok()) PauseIfRequested("gpushare-quiesced");
  if (st.ok()) st = RecordShares(procs, manifest_of);
  if (!st.ok()) return st.Then("resuming the processes", ResumeAll(procs));
  if (hold != nullptr) {
    auto t_hold = Clock::now();
    *hold = HoldMemory(procs);
    timings["gpushare-hold"] = SecondsSince(t_hold);
  }
  auto t1 = Clock::now();
  std::vector<nlohmann::json> figures(procs.size());
  std::vector<Status> released = OnEach(
      procs,
      [&](const ShimProcess& p) -> Status {
        ControlRequest req{ShimCommand::kRelease, chunk_store, manifest_of(p), 10000};
        GPUSNAP_ASSIGN_OR_RETURN(nlohmann::json reply, Send(p, req, kMovingMemoryWaitMs));
        figures[static_cast<size_t>(&p - procs.data())] = reply.value("last", nlohmann::json::object());
        return Status::Ok();
      },
      &timings, "gpushare-release");
  timings["gpushare-release"] = SecondsSince(t1);
  AddReleaseFigures(figures, timings);
  if (st = FirstError(released); !st.ok()) {
    // A failed release rolled itself back; the others come back from their chunks.
    Status loaded = FirstError(OnEach(procs, [&](const ShimProcess& p) {
      size_t i = static_cast<size_t>(&p - procs.data());
      return released[i].ok() ? Command(p, ShimCommand::kLoad, chunk_store, manifest_of(p)) : Status::Ok();
    }));
    return st.Then("loading the released memory back", loaded)
        .Then("re-importing the shared memory", RemapShares(procs, manifest_of))
        .Then("resuming the processes", ResumeAll(procs));
  }
  return Status::Ok();
}

// Load every released process (all of them, or only those the shim says are
// released), then resume every one.
Status LoadAndResume(const std::vector<ShimProcess>& procs, const std::string& chunk_store,
                     const ManifestOf& manifest_of, bool only_released, AfterLoad after,
                     std::map<std::string, double>& timings) {
  auto t0 = Clock::now();
  std::vector<Status> loaded = OnEach(procs, [&](const ShimProcess& p) -> Status {
    if (only_released) {
      GPUSNAP_ASSIGN_OR_RETURN(auto state, Send(p, {ShimCommand::kState, "", "", 10000}, 30000));
      if (state.value("state", "") != "released") return Status::Ok();
    }
    return Command(p, ShimCommand::kLoad, chunk_store, manifest_of(p));
  }, &timings, "gpushare-load");
  timings["gpushare-load"] = SecondsSince(t0);
  GPUSNAP_RETURN_IF_ERROR(FirstError(loaded));
  auto t_remap = Clock::now();
  GPUSNAP_RETURN_IF_ERROR(RemapShares(procs, manifest_of));
  timings["gpushare-remap"] = SecondsSince(t_remap);
  if (after == AfterLoad::kHold) return Status::Ok();
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

Result<nlohmann::json> Send(const ShimProcess& p, const ControlRequest& request, int timeout_ms, int send_fd,
                            UniqueFd* received) {
  std::string what = fmt::format("gpushare `{}` of pid {}", ShimCommandName(request.command), p.pid);
  GPUSNAP_ASSIGN_OR_RETURN(ControlExchange got,
                           ExchangeControlLine(p.socket, FormatControlRequest(request), timeout_ms, send_fd, what));
  auto parsed = ParseControlReply(got.reply);
  if (!parsed.ok()) return parsed.status().Wrap(what);
  if (received != nullptr) *received = std::move(got.passed_fd);
  return parsed;
}

int QuiesceAttemptMs(int attempt, int timeout_ms) {
  // Most attempts fail only by landing while the processes are at different
  // points of their work, so many short ones, at varying moments, stand the
  // best chance: 200 ms sixteen times, then 400 ms eight times, ... up to 3.2 s.
  int ms = attempt <= 16 ? 200 : 200 << std::min(1 + (attempt - 17) / 8, 4);
  return std::min(ms, timeout_ms);
}

Result<std::vector<std::vector<Share>>> MatchShares(const std::vector<ShimProcess>& procs,
                                                    const std::vector<ProcessSharing>& sharing,
                                                    const SameFile& same_file) {
  std::vector<std::vector<Share>> out(procs.size());
  for (size_t i = 0; i < procs.size() && i < sharing.size(); ++i) {
    for (const KeptFd& imp : sharing[i].imports) {
      bool found = false;
      for (size_t j = 0; j < procs.size() && j < sharing.size() && !found; ++j) {
        if (j == i) continue;
        for (const KeptFd& exp : sharing[j].exports) {
          if (!same_file(i, imp.fd, j, exp.fd)) continue;
          out[i].push_back({imp.id, procs[j].ns_pid, exp.id});
          found = true;
          break;
        }
      }
      if (!found)
        return Status::Error(Code::kFailedPrecondition,
                             "pid {} maps device memory ({:#x}) that no other GPU process of the tree exported: "
                             "gpushare takes memory shared within the processes it checkpoints only",
                             procs[i].pid, imp.id);
    }
  }
  return out;
}

ProcessSharing SharingFromState(const nlohmann::json& state) {
  ProcessSharing out;
  auto read = [&](const char* list, const char* key, std::vector<KeptFd>& into) {
    if (!state.contains(list) || !state[list].is_array()) return;
    for (const auto& e : state[list]) {
      if (e.is_object() && e.value(key, nlohmann::json()).is_number_unsigned() && e.value("fd", -1) >= 0)
        into.push_back({e[key].get<uint64_t>(), e["fd"].get<int>()});
    }
  };
  read("exports", "object", out.exports);
  read("imports", "import", out.imports);
  return out;
}

std::string EncodeShares(const std::vector<Share>& shares) {
  nlohmann::json j = nlohmann::json::array();
  for (const Share& s : shares)
    j.push_back({{"import", s.import}, {"exporter_ns_pid", s.exporter_ns_pid}, {"object", s.object}});
  return j.dump(1) + "\n";
}

Result<std::vector<Share>> DecodeShares(std::string_view text, const std::string& path) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&] { return Status::Error(Code::kCorruption, "`{}` is not a list of shares", path); };
  if (!j.is_array()) return bad();
  std::vector<Share> out;
  for (const auto& e : j) {
    if (!e.is_object() || !e.value("import", nlohmann::json()).is_number_unsigned() ||
        !e.value("exporter_ns_pid", nlohmann::json()).is_number_integer() ||
        !e.value("object", nlohmann::json()).is_number_unsigned())
      return bad();
    out.push_back({e["import"].get<uint64_t>(), e["exporter_ns_pid"].get<int>(), e["object"].get<uint64_t>()});
  }
  return out;
}

std::string SharesPath(const std::string& manifest_path) {
  std::string base = manifest_path;
  if (base.ends_with(".chunks")) base.resize(base.size() - 7);
  return base + ".shares";
}

std::string ManifestPath(const std::string& dir, const ShimProcess& p) {
  return fmt::format("{}/{}.chunks", dir, p.ns_pid);
}

namespace {

// Each process adopts its allocations in `allocations_of(ns pid)`, all at once.
Status AdoptEach(const std::vector<ShimProcess>& procs,
                 const std::function<std::vector<PreloadedAllocation>&(int ns_pid)>& allocations_of,
                 std::map<std::string, double>& timings) {
  auto t0 = Clock::now();
  std::vector<std::vector<PreloadedAllocation>*> lists;
  for (const ShimProcess& p : procs) lists.push_back(&allocations_of(p.ns_pid));
  std::vector<Status> adopted = OnEach(procs, [&](const ShimProcess& p) -> Status {
    for (PreloadedAllocation& a : *lists[static_cast<size_t>(&p - procs.data())]) {
      ControlRequest req{ShimCommand::kAdopt, "", "", 10000, a.va};
      GPUSNAP_RETURN_IF_ERROR(Send(p, req, 30000, a.fd.get()).status());
    }
    return Status::Ok();
  });
  timings["gpushare-adopt"] = SecondsSince(t0);
  return FirstError(adopted);
}

}  // namespace

bool KeepMemoryFromEnv() {
  const char* v = std::getenv("GPUSNAP_GPUSHARE_KEEP");
  return v == nullptr || std::string_view(v) != "0";
}

Status ReleaseAll(const std::vector<ShimProcess>& procs, const std::string& chunk_store,
                  const std::string& manifest_dir, int quiesce_timeout_ms, std::map<std::string, double>& timings,
                  HeldMemory* hold) {
  return QuiesceAndRelease(procs, chunk_store, [&](const ShimProcess& p) { return ManifestPath(manifest_dir, p); },
                           quiesce_timeout_ms, timings, hold);
}

Status AdoptHeld(const std::vector<ShimProcess>& procs, HeldMemory& held, std::map<std::string, double>& timings) {
  return AdoptEach(procs, [&](int ns_pid) -> std::vector<PreloadedAllocation>& { return held.by_pid[ns_pid]; },
                   timings);
}

Status AdoptPreloaded(const std::vector<ShimProcess>& procs, PreloadedMemory& preloaded,
                      std::map<std::string, double>& timings) {
  return AdoptEach(procs, [&](int ns_pid) -> std::vector<PreloadedAllocation>& { return preloaded.Of(ns_pid); },
                   timings);
}


Status LoadAll(const std::vector<ShimProcess>& procs, const std::string& chunk_store, const std::string& manifest_dir,
               AfterLoad after, std::map<std::string, double>& timings) {
  return LoadAndResume(procs, chunk_store, [&](const ShimProcess& p) { return ManifestPath(manifest_dir, p); }, false,
                       after, timings);
}

Result<chunks::ChunkManifest> ReadManifestOf(const std::string& manifest_dir, int ns_pid) {
  std::string path = ManifestPath(manifest_dir, {0, ns_pid, ""});
  GPUSNAP_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  return chunks::DecodeChunkManifest(bytes, path);
}

Status CheckManifests(const std::string& chunk_store, const std::string& manifest_dir, const std::vector<int>& ns_pids,
                      const std::set<std::string>& arriving) {
  for (int ns_pid : ns_pids) {
    std::string path = ManifestPath(manifest_dir, {0, ns_pid, ""});
    GPUSNAP_ASSIGN_OR_RETURN(chunks::ChunkManifest manifest, ReadManifestOf(manifest_dir, ns_pid));
    GPUSNAP_ASSIGN_OR_RETURN(chunks::ChunkStore store, chunks::ChunkStore::Open(chunk_store));
    for (const chunks::ChunkedAllocation& a : manifest.allocations) {
      for (const chunks::ChunkRef& ref : a.chunks) {
        if (ref.zero || arriving.contains(chunks::DigestHex(ref.digest))) continue;
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

Result<std::map<std::array<uint8_t, 16>, uint64_t>> DeviceBytesByGpu(const std::string& manifest_dir,
                                                                     const std::vector<int>& ns_pids) {
  std::map<std::array<uint8_t, 16>, uint64_t> out;
  for (int ns_pid : ns_pids) {
    GPUSNAP_ASSIGN_OR_RETURN(chunks::ChunkManifest manifest, ReadManifestOf(manifest_dir, ns_pid));
    for (const chunks::ChunkedAllocation& a : manifest.allocations) out[a.device_uuid] += a.size;
  }
  return out;
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
  return fmt::format("{}/{}", chunks::SuspendedRoot(store), p.pid);
}

Result<std::vector<chunks::ChunkRef>> SuspendedChunks(const std::string& store, const std::vector<ShimProcess>& procs) {
  std::vector<std::pair<std::string, int>> manifests;
  for (const ShimProcess& p : procs) manifests.emplace_back(SuspendedDir(store, p), p.ns_pid);
  return PreloadedChunks(manifests);
}

Status SuspendInPlace(const std::vector<ShimProcess>& procs, const std::string& store, int quiesce_timeout_ms,
                      std::map<std::string, double>& timings) {
  // Each process keeps its manifest in a directory of its own.
  for (const ShimProcess& p : procs) GPUSNAP_RETURN_IF_ERROR(MakeDirs(SuspendedDir(store, p), 0700));
  GPUSNAP_ASSIGN_OR_RETURN(auto chunk_lock,
                           chunks::ChunkStoreLock::Acquire(store, chunks::ChunkStoreLock::Mode::kShared,
                                                           chunks::kChunkWriterWaitMs));
  return QuiesceAndRelease(procs, store, [&](const ShimProcess& p) { return ManifestPath(SuspendedDir(store, p), p); },
                           quiesce_timeout_ms, timings);
}

Status ResumeInPlace(const std::vector<ShimProcess>& procs, const std::string& store,
                     std::map<std::string, double>& timings) {
  GPUSNAP_RETURN_IF_ERROR(LoadAndResume(
      procs, store, [&](const ShimProcess& p) { return ManifestPath(SuspendedDir(store, p), p); }, true,
      AfterLoad::kResume, timings));
  // Left behind, a manifest would keep its chunks from `gpusnap gc` for ever.
  for (const ShimProcess& p : procs)
    GPUSNAP_RETURN_IF_ERROR(RemoveTree(SuspendedDir(store, p)).Wrap("the processes run again, but"));
  return Status::Ok();
}

InPlaceWhole JudgeInPlace(const std::vector<InPlaceShimState>& states) {
  bool all_running = true, all_released = true;
  for (const InPlaceShimState& s : states) {
    all_running = all_running && s.state == "running";
    all_released = all_released && s.state == "released" && s.released_bytes == s.bytes;
  }
  if (all_running) return InPlaceWhole::kRunning;
  return all_released ? InPlaceWhole::kSuspended : InPlaceWhole::kUnsettled;
}

const char* InPlaceWholeName(InPlaceWhole whole) {
  switch (whole) {
    case InPlaceWhole::kRunning: return "running";
    case InPlaceWhole::kSuspended: return "suspended";
    case InPlaceWhole::kUnsettled: return "unsettled";
  }
  return "?";
}

Result<std::vector<InPlaceShimState>> InPlaceStatesOf(const std::vector<ShimProcess>& procs) {
  std::vector<InPlaceShimState> out;
  for (const ShimProcess& p : procs) {
    // Behind a release or load of many gigabytes, as long as those may take.
    GPUSNAP_ASSIGN_OR_RETURN(auto j, Send(p, {ShimCommand::kState, "", "", 10000}, 3600 * 1000));
    out.push_back({j.value("state", ""), j.value("bytes", uint64_t{0}), j.value("released_bytes", uint64_t{0})});
  }
  return out;
}

Result<InPlaceWhole> SettleInPlace(const std::vector<ShimProcess>& procs, const std::string& store,
                                   std::map<std::string, double>& timings) {
  GPUSNAP_ASSIGN_OR_RETURN(auto states, InPlaceStatesOf(procs));
  InPlaceWhole whole = JudgeInPlace(states);
  if (whole != InPlaceWhole::kUnsettled) return whole;
  GPUSNAP_RETURN_IF_ERROR(ResumeInPlace(procs, store, timings));
  return InPlaceWhole::kRunning;
}

Status ResumeAll(const std::vector<ShimProcess>& procs) {
  return FirstError(OnEach(procs, [&](const ShimProcess& p) { return Command(p, ShimCommand::kResume); }));
}

}  // namespace gpusnap::gpushare::control
