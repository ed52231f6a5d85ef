// Workloads: process trees that gpusnap started in a namespace of their own
// (`gpusnap run`) or restored (`gpusnap restore`), recorded by name so they can
// be listed and checkpointed by name.
//
// The records live in the run directory ($GPUSNAP_RUN_DIR, default
// /run/gpusnap), one JSON file per name, each written atomically. A name is
// claimed (NameClaim) before anything that will carry it starts, so of two
// gpusnaps starting one name, one is refused before it has started anything.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "gpusnap/status.h"
#include "util/lock_file.h"

namespace gpusnap {

struct Workload {
  std::string name;
  pid_t pid = 0;                 // the tree's root, host pid
  uint64_t start_time = 0;       // with pid: guards against pid reuse
  pid_t reaper_pid = 0;          // pid 1 of its namespace, host pid
  std::vector<std::string> cmdline;
  std::string log;
  std::string started;           // RFC 3339
  std::string restored_from;     // snapshot id, if restored
  // A standby (`gpusnap restore --standby`, docs/STANDBY.md): restored but
  // for the GPU, every task stopped, waiting for `gpusnap wake`. `store` is
  // the snapshot store it was restored from, where the wake finds the
  // snapshot again. Records written before standbys read as not standby.
  bool standby = false;
  // Suspended in place (`gpusnap gpushare suspend NAME`, the agent's
  // suspend and swap: docs/GPUSHARE.md): its processes alive, their device
  // memory released into `store`'s chunk store, its manifests under
  // <store>/suspended/. Records written before read as not suspended.
  bool suspended = false;
  std::string store;
  std::string lazy_pages;        // a --lazy-pages restore's work dir: its page server's state and logs
  bool running = false;          // computed when listed, not stored
};

// "running", "standby" (its tree is there, stopped, waiting for a wake),
// "suspended" (running, its device memory released in place) or "exited",
// as `gpusnap ps` shows it.
const char* WorkloadState(const Workload& workload);

struct RunOptions {
  std::string name;              // REQUIRES: [A-Za-z0-9._-]{1,40}, not starting with '.'
  std::vector<std::string> argv; // REQUIRES: non-empty
  std::string log;               // default: <run dir>/logs/<name>.log
  bool gpushare = false;         // preload the gpushare shim (GpushareShimPath) into the workload
};

// The gpushare shim library: $GPUSNAP_GPUSHARE_LIB, else libgpusnap_gpushare.so
// beside the gpusnap binary, in ../lib/gpusnap or in ../lib from it. kNotFound
// naming the places looked at.
Result<std::string> GpushareShimPath();

std::string RunDir();

// Starts argv in a new pid + mount namespace, detached. kAlreadyExists if a
// running workload already has the name, or another gpusnap is starting one
// under it; then nothing was started.
Result<Workload> RunWorkload(const RunOptions& options);

// The exclusive right to record a workload under a name, held from before the
// tree starts until RecordWorkload writes its record (or the claim is
// dropped). Held as a flock on <run dir>/workloads/<name>.claim, which the
// kernel releases with the claimant's descriptor: a gpusnap that dies holding
// a name leaves no claim that blocks the next one. Move-only; releases on
// destruction.
class NameClaim {
 public:
  const std::string& name() const { return name_; }

 private:
  friend Result<NameClaim> ClaimWorkloadName(const std::string& name);
  NameClaim(std::string name, LockFile lock) : name_(std::move(name)), lock_(std::move(lock)) {}

  std::string name_;
  LockFile lock_;  // the claim itself
};

// Claims `name` for a workload about to start. kInvalidArgument for an invalid
// name; kAlreadyExists if a running workload has it ("... is already running
// (pid P)") or another gpusnap holds its claim ("... is already being started
// (by gpusnap pid P)"). Does not wait.
Result<NameClaim> ClaimWorkloadName(const std::string& name);

// All recorded workloads with `running` filled in; records of workloads that
// have exited are kept until their name is reused.
Result<std::vector<Workload>> ListWorkloads();

// kNotFound if no workload has that name.
Result<Workload> FindWorkload(const std::string& name);

// Records a workload under the name `claim` holds (REQUIRES: workload.name ==
// claim.name()), replacing an exited one of that name, then releases the claim.
Status RecordWorkload(const Workload& workload, NameClaim claim);

// Rewrites the record of a workload already recorded under its name, that
// same tree (pid and start time): a standby woken. kNotFound without such a
// record, kFailedPrecondition when the record is another tree's.
Status UpdateWorkload(const Workload& workload);

// Removes the record of workload `name` (a woken standby whose wake failed
// and whose tree was torn down). A record already gone is no error.
Status RemoveWorkloadRecord(const std::string& name);

// The exclusive right to wake the standby `name`, held as a LockFile on
// <run dir>/workloads/<name>.wake until dropped. kAlreadyExists ("... is
// already being woken (by gpusnap pid P)") while another gpusnap holds it.
Result<LockFile> ClaimWake(const std::string& name);

// Ends the workload `name`, running or standby: its reaper (pid 1 of its
// namespace) is sent SIGTERM and kills everything the namespace holds; waits
// up to `wait` for the tree's root to be gone. kNotFound for an unknown name,
// kFailedPrecondition for one that has exited already, kTimeout when it
// outlives the wait.
Status EndWorkload(const std::string& name, std::chrono::milliseconds wait);

bool IsValidWorkloadName(std::string_view name);
// The rule's one message: kInvalidArgument "invalid workload name `NAME`:
// use 1-40 ..." (the whole rule, first character included), or Ok.
Status CheckWorkloadName(std::string_view name);

}  // namespace gpusnap
