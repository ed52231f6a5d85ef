// gpusnap's side of gpushare: finding the shim in a tree's GPU processes and
// driving all of them together over their control sockets (protocol.h).
//
// ReleaseAll and LoadAll act on every process concurrently and are all or
// nothing: when one process fails, every process that had already changed is
// brought back (loaded, resumed), so the tree keeps working.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpushare/protocol.h"
#include "gpusnap/status.h"

namespace gpusnap::gpushare {

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
Result<nlohmann::json> Send(const ShimProcess& p, const ControlRequest& request, int timeout_ms);

// The manifest of one process inside `dir` (a snapshot's gpu/ directory).
std::string ManifestPath(const std::string& dir, const ShimProcess& p);

// Quiesce every process, then release every process's device memory into
// `chunk_store` with its manifest in `manifest_dir`. Timings: gpushare-quiesce,
// gpushare-release. On failure every process is back to running.
Status ReleaseAll(const std::vector<ShimProcess>& procs, const std::string& chunk_store,
                  const std::string& manifest_dir, int quiesce_timeout_ms, std::map<std::string, double>& timings);

// Load every process's device memory back, then resume every one (only after
// all have loaded). Timing: gpushare-load, gpushare-resume.
Status LoadAll(const std::vector<ShimProcess>& procs, const std::string& chunk_store, const std::string& manifest_dir,
               std::map<std::string, double>& timings);

// Before a restore touches anything: every process's manifest in
// `manifest_dir` decodes, and every chunk it names is in `chunk_store` with
// its size (the bytes are checked against their digests as they load).
Status CheckManifests(const std::string& chunk_store, const std::string& manifest_dir, const std::vector<int>& ns_pids);

// `gpusnap gpushare suspend|resume`: the processes `pids` (each must load the
// shim) give up their device memory in place, into `store`'s chunk store with
// the manifests under <store>/suspended/<pid>/, and take it back.
Result<std::vector<ShimProcess>> ShimProcessesOf(const std::vector<pid_t>& pids);
std::string SuspendedDir(const std::string& store, const ShimProcess& p);
Status SuspendInPlace(const std::vector<ShimProcess>& procs, const std::string& store, int quiesce_timeout_ms,
                      std::map<std::string, double>& timings);
Status ResumeInPlace(const std::vector<ShimProcess>& procs, const std::string& store,
                     std::map<std::string, double>& timings);

// Resume every process (after a quiesce only).
Status ResumeAll(const std::vector<ShimProcess>& procs);

}  // namespace gpusnap::gpushare
