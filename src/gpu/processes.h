// The GPU steps of checkpoint and restore (docs/GPU-CHECKPOINT.md), over the
// CUDA driver's checkpoint API (src/cuda) and per-thread freezing (src/ns).
//
// Suspend: lock every GPU process (all before any checkpoint: a rank blocked
// in a collective cannot drain while its peer is locked), stop every CPU
// thread but the driver's restore thread (pinned host buffers vanish at the
// checkpoint), checkpoint every process, then leave each one in group-stop for
// CRIU. Resume is the reverse, for a restored tree or a rolled-back source:
// with only the restore threads running, restore every process, then unlock
// every one only after all are restored, then let all threads run.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cuda/checkpoint_api.h"
#include "cuda/driver.h"
#include "cuda/gpu_map.h"
#include "gpusnap/snapshot.h"
#include "gpusnap/status.h"

namespace gpusnap::gpu {

// The processes of `tree` that hold a CUDA context (map /dev/nvidia*).
std::vector<pid_t> FindGpuProcesses(const std::vector<pid_t>& tree);

// The NVIDIA kernel module's version ("580.159.04"), from /proc/driver/nvidia/version.
Result<std::string> KernelDriverVersion();

// The UUIDs of the GPUs `pid` has opened (its /dev/nvidiaN mappings, through
// /proc/driver/nvidia/gpus/*/information). Empty when unknown.
std::vector<std::string> GpusOpenedBy(pid_t pid);

// Describes the GPU side of a tree for the snapshot: the GPUs its processes
// opened (all visible GPUs when that cannot be told), driver versions.
SnapshotGpuState Describe(const cuda::Driver& driver, const std::vector<cuda::GpuInfo>& visible,
                          const std::vector<pid_t>& gpu_pids, const std::vector<int>& ns_pids,
                          const std::string& kernel_driver);

// Describe for the GPU processes of a tree, with what it needs read here: the
// visible GPUs, the kernel driver's version, each pid's pid in its namespace.
Result<SnapshotGpuState> DescribeTree(const cuda::Driver& driver, const std::vector<pid_t>& gpu_pids);

// Pure: may a snapshot taken with `snap` be restored here, onto `here` with
// `map`? kFailedPrecondition naming what differs: the driver's major version,
// a GPU that is neither here nor mapped, a target GPU of another compute
// capability.
Status CheckCompatible(const SnapshotGpuState& snap, const std::vector<cuda::GpuInfo>& here,
                       const std::string& kernel_driver_here, const cuda::GpuMap& map);

// Pure: the GPU map for a restore from `--gpu-map` text (old=new, indices or
// UUIDs; old indices are the snapshot's) or `--gpus` (the snapshot's GPUs in
// order onto these indices here). Both empty: no remapping.
Result<cuda::GpuMap> PlanGpuMap(const SnapshotGpuState& snap, const std::vector<cuda::GpuInfo>& here,
                                const cuda::GpuMapSpec& spec);

// Lock, freeze, checkpoint and stop every pid. Returns each pid's restore
// thread as the driver names it (its tid inside the process's namespace,
// which a CRIU restore keeps). On failure at any step, every pid is back to
// running, restored and unlocked (the driver API's own rollback plus ours),
// and a rollback that failed too is named in the error.
Result<std::vector<pid_t>> Suspend(const cuda::Driver& driver, const std::vector<pid_t>& pids, int lock_timeout_ms,
                                   std::map<std::string, double>& timings);

// Restore and unlock every pid, now in group-stop (as Suspend or CRIU's
// restore left them), then let all their threads run. `restore_tids` are
// Suspend's: a stopped process cannot be asked for its restore thread.
Status Resume(const cuda::Driver& driver, const std::vector<pid_t>& pids, const std::vector<pid_t>& restore_tids,
              const cuda::GpuMap& map, std::map<std::string, double>& timings);

// Resume on a thread of its own, waited for until `timeout`: a driver
// restore can block without end, and a restore must still answer. On timeout
// (kTimeout) the thread is left behind, owning its ptrace stops and sharing
// the driver; the caller tears the tree down, which ends what it waits on.
Status ResumeWithin(std::shared_ptr<cuda::Driver> driver, std::vector<pid_t> pids, std::vector<pid_t> restore_tids,
                    cuda::GpuMap map, std::chrono::seconds timeout, std::map<std::string, double>& timings);

}  // namespace gpusnap::gpu
