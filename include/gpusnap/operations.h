// The operations gpusnap exists for, each the one front door of its story:
// the CLI, the agent, its Kubernetes watcher and the tests all call these.
// Each reads as the numbered steps of docs/ARCHITECTURE.md ("A checkpoint",
// "A restore", "A wake") in src/snapshot/checkpoint.cc, restore.cc, wake.cc.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cuda/gpu_map.h"
#include "gpusnap/distribution.h"
#include "gpusnap/gc.h"
#include "gpusnap/progress.h"
#include "gpusnap/snapshot.h"
#include "gpusnap/status.h"
#include "gpusnap/workload.h"
#include "snapshot/target.h"
#include "store/snapshot_ref.h"

namespace gpusnap::cuda {
class GpuSession;  // cuda/gpu_session.h
}
namespace gpusnap::gpushare::control {
class PinnedTier;  // gpushare/control/pinned_tier.h
}

namespace gpusnap {

// What a long-lived process (the agent) keeps for the GPU steps of every
// operation it runs, instead of each making its own: the driver loaded once
// with a context per GPU, and the pinned chunk tier (docs/AGENT.md). Unset
// (the CLI's one-shot operations): the operation loads the driver itself, and
// reads every chunk from the store.
struct GpuResources {
  std::shared_ptr<cuda::GpuSession> session;
  std::shared_ptr<gpushare::control::PinnedTier> pinned_tier;  // gpushare's restores and wakes
};

std::string DefaultStore();  // $GPUSNAP_STORE or /var/lib/gpusnap
// The store a request names (`--store`, a record's), else DefaultStore():
// the one place the default is filled in.
std::string StoreOrDefault(const std::string& given);

struct CheckpointOptions {
  TargetSpec target;            // a workload, a pid, a container or a pod's container (ParseTargetArgument)
  std::string store;            // default DefaultStore()
  std::string id;               // default: generated from the name
  bool leave_running = false;   // keep the source running after the dump
  bool tcp_established = false; // dump established TCP connections too
  std::string criu_bundle;      // default: found (criu/bundle.h)
  int timeout_s = 600;          // deadline for the CRIU dump
  bool verbose = false;         // CRIU log level 4
  std::string criu_config;      // an extra CRIU configuration file
  int gpu_lock_timeout_ms = 10000;  // how long the driver may take to drain each GPU process
  // The capture path (docs/CAPTURE-PATHS.md): the process (CRIU and the GPU
  // state), the rootfs (the container's writable layer and its caches: the
  // workload goes on running), both, or auto (process when the tree is
  // checkpointable, else rootfs, the reason recorded). Unset: the process
  // path (through the agent: the pod's annotation, else auto).
  std::optional<CapturePath> capture_path;
  std::vector<std::string> caches;   // rootfs: container paths of cache directories, one archive each
  std::vector<std::string> exclude;  // rootfs: patterns the capture leaves out besides the defaults
  std::string image;                 // rootfs: the container's image; default: its OCI bundle's annotation
  // The namespace and pod the tree belongs to, recorded in gpusnap.json
  // (docs/SECURITY.md): the agent's, which knows the pod. Unset: the
  // snapshot belongs to no namespace (the CLI's).
  std::optional<SnapshotOwner> owner;
  GpuResources gpu_resources;
  ProgressFn progress;
};

// Checkpoints the tree and publishes the snapshot atomically. On any failure
// the source keeps running and no snapshot (not even a partial one) appears.
// Errors: kNotFound (target), kIoError (store, disk), kExternal (CRIU, with
// the Error lines of its log), kTimeout.
Result<SnapshotMeta> Checkpoint(const CheckpointOptions& options);

struct RestoreOptions {
  // REQUIRES: set (ParseSnapshotRef, where the request entered): a
  // snapshot in the store, or a registry reference, whose files are pulled
  // first and whose gpushare chunks arrive while the restore goes on.
  SnapshotRef source;
  RegistryAccess registry;      // for a reference
  std::string store;            // default DefaultStore()
  std::string name;             // the restored workload's name; default: the source's name
  std::string criu_bundle;
  int timeout_s = 600;
  bool verbose = false;
  std::string criu_config;
  cuda::GpuMapSpec gpus;        // onto which GPUs of this machine; empty: each onto its own index
  // A container id (or unique prefix) whose init is an idle `gpusnap
  // __placeholder`: restore into its pid + mount namespaces and its cgroups
  // instead of a fresh namespace. Empty: a fresh namespace.
  std::string into_container;
  // The host's transparent huge pages set to `always` while CRIU restores,
  // its own mode put back after (host/huge_pages.h).
  bool huge_pages = false;
  // A standby (docs/STANDBY.md): everything restored but the GPU, every task
  // left stopped, holding no GPU memory and no context, recorded as a standby
  // for Wake. A GPU snapshot only, into a fresh namespace, without gpu_map
  // and gpus (chosen at the wake).
  bool standby = false;
  // The tree's private anonymous memory arrives after the restore returns,
  // served on demand and copied in the background by a `criu lazy-pages`
  // daemon under a keeper that kills the tree should the daemon die before
  // every page is in (criu/lazy_pages_keeper.h). Needs userfaultfd.
  bool lazy_pages = false;
  GpuResources gpu_resources;
  ProgressFn progress;
  // Called once the snapshot's metadata is read (from the store, or the
  // registry), before anything of the restore starts: an error refuses the
  // restore. The agent marks the snapshot in use there. Empty: nothing.
  std::function<Status(const SnapshotMeta&)> on_source_opened;
};

// Pure: what a restore refuses whatever the snapshot (kInvalidArgument or
// kNotSupported, naming the options): no source, a standby into a
// container, a standby with GPUs chosen now. Restore calls it before any disk
// or network work.
Status CheckRestoreOptions(const RestoreOptions& options);

struct RestoreResult {
  Workload workload;
  CapturePath restore_path = CapturePath::kProcess;  // or kRootfs (a cold start with warm caches)
  std::string fallback_reason;           // a `both` snapshot restored by rootfs: why not as a process
  std::map<std::string, double> timings_s;
  std::string log;              // CRIU's restore log
  std::optional<TransferResult> pulled;  // a registry reference's pull, once the snapshot joined the store
};

// The name a restore of `meta` gives its workload: `asked` if any, else the
// source's, else "restored-<source pid>". Pure.
std::string RestoredWorkloadName(const SnapshotMeta& meta, const std::string& asked);

// Verifies the snapshot, then restores it into a fresh pid + mount namespace,
// or into a placeholder container's (options.into_container).
// A snapshot that fails verification is refused before anything starts.
Result<RestoreResult> Restore(const RestoreOptions& options);

struct WakeOptions {
  std::string name;             // REQUIRES: a standby workload (RestoreOptions::standby)
  cuda::GpuMapSpec gpus;        // as RestoreOptions::gpus, chosen now
  int timeout_s = 600;          // how long the driver's restore may take
  GpuResources gpu_resources;
  ProgressFn progress;
};

struct WakeResult {
  Workload workload;            // running now
  std::map<std::string, double> timings_s;
};

// Wakes a standby onto the GPUs chosen now: its snapshot's metadata read
// again from its store, the gpushare chunks checked present, the GPU map
// planned and checked, and the device memory it needs (gpushare) checked to
// fit each target GPU's free memory, before anything is touched; then
// restore's GPU step, and the tree goes. A refusal before the GPU is touched
// (kNotFound: no such workload, or its snapshot was removed; kFailedPrecondition:
// not a standby, too little free memory, a GPU that does not fit;
// kAlreadyExists: another wake of it runs) leaves the standby as it was. A
// failure after it tears the tree down and removes the record, and says so.
Result<WakeResult> Wake(const WakeOptions& options);

// Suspend and resume in place (docs/GPUSHARE.md, "Suspend, resume and swap
// in place"): a gpushare workload's processes stay alive while their device
// memory goes to the chunk store of `store` and is freed, then comes back at
// the same addresses. Every front door (`gpusnap gpushare suspend|resume|swap`,
// the agent's routes) calls these.
struct InPlaceOptions {
  // A workload by name (recorded suspended, then running again), or, when
  // the name is empty, the processes `pids` (each must load the shim; nothing
  // is recorded). REQUIRES: exactly one of them.
  std::string name;
  std::vector<pid_t> pids;
  std::string store;            // suspend: default DefaultStore(); resume: the record's, else this
  int quiesce_timeout_ms = 10000;  // suspend: how long running GPU work may take to drain
  GpuResources gpu_resources;      // the agent's driver and pinned tier (a suspend queues its chunks for the
                                   // tier, a resume fills from it); none: made for the call
  ProgressFn progress;
};

struct InPlaceResult {
  std::optional<Workload> workload;  // by name: its record as it is now
  std::vector<pid_t> pids;           // the GPU processes acted on
  std::map<std::string, double> timings_s;
};

// All or none: on failure every process runs on as before, and the record
// is unchanged. Errors: kNotFound (no such workload or pid),
// kFailedPrecondition (exited, a standby, already suspended, no GPU process,
// a process without the shim), the shims' (kTimeout: work that did not
// drain).
Result<InPlaceResult> SuspendInPlace(const InPlaceOptions& options);

// Checks every process's manifest and chunks before touching anything; then
// makes and fills the released memory here (the preload, as a wake's) for
// the processes to adopt, they load the rest and resume. A refusal
// (kFailedPrecondition: running, not suspended; a missing chunk) leaves it
// suspended; so does a failed load (the shim frees what it loaded).
Result<InPlaceResult> ResumeInPlace(const InPlaceOptions& options);

struct SwapOptions {
  std::string suspend;          // a running workload: suspended first, freeing its memory
  std::string resume;           // a suspended workload: resumed after
  std::string store;            // where `suspend` goes; default DefaultStore()
  int quiesce_timeout_ms = 10000;
  GpuResources gpu_resources;   // as InPlaceOptions'
  ProgressFn progress;
};

struct SwapResult {
  Workload suspended, resumed;
  std::map<std::string, double> timings_s;  // "suspend", "resume" (to its processes running), and theirs
};

// Checks both first (the one running, the other suspended with its chunks
// present), then suspends one and resumes the other. When the resume fails,
// the suspended one is resumed again (the undo), and the error names both.
Result<SwapResult> SwapWorkloads(const SwapOptions& options);

// A workload whose suspend or resume stopped half way (its gpusnap, or the
// agent, killed) made whole: running or suspended, never between; its record
// says which. What it is now.
Result<Workload> SettleWorkload(const std::string& name, const std::string& store);

// Garbage collection of the gpushare chunk store (docs/GPUSHARE.md): the
// chunk files no manifest names any more (of a snapshot, a snapshot being
// written, a process suspended in place), and temporaries of interrupted
// chunk writes older than an hour.
struct GcOptions {
  std::string store;            // default DefaultStore()
  bool dry_run = false;         // decide and report; delete nothing
  int wait_ms = 0;              // how long to wait for checkpoints writing chunks
  // Bytes of chunks no manifest names to keep, the most recently used
  // (src/chunks/chunk_gc.h). Unset: the store's chunk_cache_bytes
  // (<store>/config.json, src/store/config.h), else 0 (none kept).
  std::optional<uint64_t> keep_unused_bytes;
};

// Marks, then sweeps. Errors: kTimeout when checkpoints hold the chunk store
// for longer than wait_ms; a manifest or a snapshot's metadata that cannot be
// read fails it before anything is deleted, naming the file, and so does the
// store's config.json when its limit is wanted; a file that cannot be
// removed, naming it.
Result<GcResult> CollectGarbage(const GcOptions& options);

struct RemoveResult {
  GcResult chunks;              // what the collection after the removal did
  Status chunks_status;         // why it did not run or failed; the snapshot is removed regardless
};

// Removes a published snapshot, once the checkpoint that wrote it has
// finished (Store::Remove waits up to a minute), then collects the chunks
// nothing names any more (keeping the store's chunk_cache_bytes of them),
// without waiting for checkpoints that hold the chunk store (`gpusnap gc`
// collects those later). Errors: the removal's only
// (kNotFound, kInvalidArgument, kIoError, kTimeout).
Result<RemoveResult> RemoveSnapshot(const std::string& store, const std::string& id);

}  // namespace gpusnap
