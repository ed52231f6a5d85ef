// gpusnap's side of gpushare: finding the shim in a tree's GPU processes and
// driving all of them together over their control sockets (protocol.h).
//
// ReleaseAll and LoadAll act on every process concurrently and are all or
// nothing: when one process fails, every process that had already changed is
// brought back (loaded, resumed), so the tree keeps working.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string_view>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chunks/chunk_manifest.h"
#include "gpushare/common/protocol.h"
#include "gpushare/control/preload.h"
#include "gpusnap/status.h"
#include "util/fd.h"

namespace gpusnap::gpushare::control {

inline constexpr const char* kShimLibraryName = "libgpusnap_gpushare.so";

struct ShimProcess {
  pid_t pid = 0;       // as this process sees it
  int ns_pid = 0;      // in its own pid namespace
  std::string socket;  // its control socket's abstract name
};

// Pure: given, for each GPU process, whether it maps the shim, is this a
// gpushare tree (true), a plain one (false), or a mix (kFailedPrecondition
// naming a pid with and a pid without)?
Result<bool> DecideShimUse(const std::vector<pid_t>& gpu_pids, const std::vector<bool>& maps_shim);

// Whether `pid` has the shim library mapped, and its path.
std::string MappedShimPath(pid_t pid);

// The shim processes among `gpu_pids`: all of them, or none (plain driver
// path), or an error for a mix.
Result<std::vector<ShimProcess>> FindShimProcesses(const std::vector<pid_t>& gpu_pids);

// One request to one process; the reply's fields. Errors name the pid.
// `send_fd` (>= 0) is passed with the request (remap); the fd the process
// passes back (export) lands in `received`.
Result<nlohmann::json> Send(const ShimProcess& p, const ControlRequest& request, int timeout_ms, int send_fd = -1,
                            UniqueFd* received = nullptr);

// The manifest of one process inside `dir` (a snapshot's gpu/ directory).
std::string ManifestPath(const std::string& dir, const ShimProcess& p);
// The manifest of the process `ns_pid` in `manifest_dir`, read and decoded
// (kIoError, kCorruption naming it).
Result<chunks::ChunkManifest> ReadManifestOf(const std::string& manifest_dir, int ns_pid);

// Device memory shared between the processes (CUDA IPC, exported VMM fds):
// each process's state lists the fds it keeps of what it exported and of
// what it imported; an import and an export that are the same open file are
// the same memory.
struct KeptFd {
  uint64_t id = 0;  // exports: the object; imports: the import
  int fd = -1;
};
struct ProcessSharing {
  std::vector<KeptFd> exports;
  std::vector<KeptFd> imports;
};
// One import of one process: whose object it is.
struct Share {
  uint64_t import = 0;
  int exporter_ns_pid = 0;
  uint64_t object = 0;

  bool operator==(const Share&) const = default;
};
// How long attempt number `attempt` (from 1) of quiescing several processes
// together may take, within `timeout_ms` in all.
int QuiesceAttemptMs(int attempt, int timeout_ms);

// Whether fd `a` of process `ia` and fd `b` of process `ib` are one open file.
using SameFile = std::function<bool(size_t ia, int a, size_t ib, int b)>;
// Pure: for each process, its imports' exporters. kFailedPrecondition naming
// the process when an import matches no export of another process in `procs`.
Result<std::vector<std::vector<Share>>> MatchShares(const std::vector<ShimProcess>& procs,
                                                    const std::vector<ProcessSharing>& sharing,
                                                    const SameFile& same_file);
ProcessSharing SharingFromState(const nlohmann::json& state);
std::string EncodeShares(const std::vector<Share>& shares);
Result<std::vector<Share>> DecodeShares(std::string_view text, const std::string& path);
// Beside a process's manifest: its imports, present only when it has some.
std::string SharesPath(const std::string& manifest_path);

// The device memory of processes that gpusnap holds through a release: an
// fd of each of their allocations, taken while they were quiesced, before
// they freed it. Memory of a POSIX-fd handle lives while an fd, a handle or a
// mapping of it does, so the processes' memory outlives its release, and they
// take it back with `adopt` instead of loading it from the chunks. A
// checkpoint with --leave-running does this unless GPUSNAP_GPUSHARE_KEEP=0
// (docs/GPUSHARE.md, "Keeping the memory of a source that runs on").
struct HeldMemory {
  std::map<int, std::vector<PreloadedAllocation>> by_pid;  // by ns pid
  size_t allocations = 0;
  uint64_t bytes = 0;
};

// Whether a checkpoint with --leave-running holds its processes' memory
// (HeldMemory): unless GPUSNAP_GPUSHARE_KEEP is 0.
bool KeepMemoryFromEnv();

// Quiesce every process, then release every process's device memory into
// `chunk_store` with its manifest in `manifest_dir`. With `hold`, gpusnap
// first takes an fd of every allocation of the shims' (`export`; one that
// cannot be exported is left to the load). Timings: gpushare-quiesce,
// gpushare-hold, gpushare-release, and the releases' figures
// (gpushare-fingerprint, and the counts gpushare-chunks-copied and
// gpushare-chunks-unchanged). On failure every process is back to running.
Status ReleaseAll(const std::vector<ShimProcess>& procs, const std::string& chunk_store,
                  const std::string& manifest_dir, int quiesce_timeout_ms, std::map<std::string, double>& timings,
                  HeldMemory* hold = nullptr);

// Hands each process the allocations gpusnap made and filled for it
// (preload.h), as `adopt` requests, all processes at once. A refusal is
// returned, and leaves that process's remaining allocations to its load.
// Timing: gpushare-adopt.
Status AdoptPreloaded(const std::vector<ShimProcess>& procs, PreloadedMemory& preloaded,
                      std::map<std::string, double>& timings);
// The same with the memory held through a release (HeldMemory).
Status AdoptHeld(const std::vector<ShimProcess>& procs, HeldMemory& held, std::map<std::string, double>& timings);

// What LoadAll does once every process has loaded: resume them all, or leave
// their work held for a later ResumeAll (a restore lets nothing run before it
// is recorded).
enum class AfterLoad { kResume, kHold };

// Load every process's device memory back, then (only after all have loaded)
// resume every one or hold them. Timing: gpushare-load, gpushare-resume.
Status LoadAll(const std::vector<ShimProcess>& procs, const std::string& chunk_store, const std::string& manifest_dir,
               AfterLoad after, std::map<std::string, double>& timings);

// Before a restore touches anything: every process's manifest in
// `manifest_dir` decodes, and every chunk it names is in `chunk_store` with
// its size (the bytes are checked against their digests as they load), but
// for those in `arriving` (32 hex; a pull still brings them).
Status CheckManifests(const std::string& chunk_store, const std::string& manifest_dir, const std::vector<int>& ns_pids,
                      const std::set<std::string>& arriving = {});

// The device memory the processes `ns_pids` had, from their manifests in
// `manifest_dir`: the sizes of their allocations summed by the UUID of the GPU
// each was checkpointed on (the zero UUID for a version 1 manifest, which
// records none). What the driver kept itself (allocations the shim leaves to
// it) is not in a manifest, so this is what a load needs at least.
Result<std::map<std::array<uint8_t, 16>, uint64_t>> DeviceBytesByGpu(const std::string& manifest_dir,
                                                                     const std::vector<int>& ns_pids);

// `gpusnap gpushare suspend|resume`: the processes `pids` (each must load the
// shim) give up their device memory in place, into `store`'s chunk store with
// the manifests under <store>/suspended/<pid>/, and take it back.
// SuspendInPlace holds the chunk store lock shared (chunk_lock.h) until the
// manifests are written.
Result<std::vector<ShimProcess>> ShimProcessesOf(const std::vector<pid_t>& pids);
std::string SuspendedDir(const std::string& store, const ShimProcess& p);
// The stored chunks the resume of `procs`, suspended in place into `store`,
// will fill (PreloadedChunks of their manifests).
Result<std::vector<chunks::ChunkRef>> SuspendedChunks(const std::string& store, const std::vector<ShimProcess>& procs);
Status SuspendInPlace(const std::vector<ShimProcess>& procs, const std::string& store, int quiesce_timeout_ms,
                      std::map<std::string, double>& timings);
Status ResumeInPlace(const std::vector<ShimProcess>& procs, const std::string& store,
                     std::map<std::string, double>& timings);

// Whether the processes of one workload are whole after an in-place suspend
// or resume that may have stopped half way (its gpusnap or agent killed): a
// shim finishes the request it was serving when its client went away, and
// answers the next one after it.
struct InPlaceShimState {
  std::string state;            // the shim's: "running", "quiesced", "released"
  uint64_t bytes = 0;           // its device memory
  uint64_t released_bytes = 0;  // of which released
};
enum class InPlaceWhole {
  kRunning,    // every process running
  kSuspended,  // every process released, all of its memory
  kUnsettled,  // anything else: quiesced, a mix, memory adopted but not loaded
};
// Pure.
InPlaceWhole JudgeInPlace(const std::vector<InPlaceShimState>& states);
const char* InPlaceWholeName(InPlaceWhole whole);

// Each process's state, waiting as long as a release or a load in flight
// may take (the shim answers once it has finished it).
Result<std::vector<InPlaceShimState>> InPlaceStatesOf(const std::vector<ShimProcess>& procs);

// Brings processes suspended in place (their manifests under
// <store>/suspended/) that are unsettled to running: the released ones load
// (adopted memory stays, the rest is made and filled), then all resume, and
// their manifests go. Running or suspended processes are left as they are.
// What they are now.
Result<InPlaceWhole> SettleInPlace(const std::vector<ShimProcess>& procs, const std::string& store,
                                   std::map<std::string, double>& timings);

// Resume every process (after a quiesce only).
Status ResumeAll(const std::vector<ShimProcess>& procs);

}  // namespace gpusnap::gpushare::control
