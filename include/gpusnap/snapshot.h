// The snapshot's metadata (gpusnap.json): the contract between checkpoint and
// restore, and what `gpusnap ls` and `inspect` show. docs/snapshot-format.md
// describes every field and its default for older snapshots.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpusnap/status.h"

namespace gpusnap {

// Major version: a reader refuses any other. Minor: fields added since, each
// optional with a written default.
inline constexpr int kSchemaMajor = 1;
inline constexpr int kSchemaMinor = 7;  // 1.1: `gpu`; 1.2: `digest`; 1.3: `gpu.gpushare`; 1.4: `criu.listen_ports`;
                                        // 1.5: `meta_sha256`; 1.6: `capture_path`, `rootfs`; 1.7: `owner`

// The largest pid the kernel hands out (PID_MAX_LIMIT, the ceiling of
// /proc/sys/kernel/pid_max): a recorded pid or tid outside 1..this is corrupt.
inline constexpr int kPidMaxLimit = 4 * 1024 * 1024;

struct SnapshotSource {
  std::string kind;                // "workload" (started by `gpusnap run`) or "pid"
  std::string name;                // workload name; empty for a bare pid
  int host_pid = 0;                // the tree's root, as the host saw it
  int ns_pid = 0;                  // the same task inside its pid namespace
  std::vector<std::string> cmdline;
  std::string log;                 // the workload's stdout/stderr file, if known
};

// Who a snapshot belongs to (schema 1.7): the Kubernetes namespace and pod
// its tree was captured from, as the agent knew them (docs/SECURITY.md,
// "Namespaces own their snapshots"). A snapshot without one (taken outside
// Kubernetes, or of an older schema) belongs to no namespace.
struct SnapshotOwner {
  std::string namespace_name;      // a DNS-1123 label
  std::string pod;                 // a DNS-1123 subdomain
  bool operator==(const SnapshotOwner&) const = default;
};

struct FileDigest {
  uint64_t size = 0;
  std::string sha256;
};

struct SnapshotGpu {
  int index = 0;                   // CUDA ordinal when checkpointed
  std::string uuid;                // "GPU-xxxxxxxx-..."
  std::string name;
  int cc_major = 0, cc_minor = 0;  // compute capability
  uint64_t total_bytes = 0;
};

// The GPU side of a snapshot (schema 1.1; absent in 1.0 and for CPU trees).
struct SnapshotGpuState {
  std::string driver_version;      // the kernel module's, e.g. "580.159.04"
  int cuda_version = 0;            // cuDriverGetVersion, e.g. 13000
  std::vector<SnapshotGpu> gpus;   // the GPUs the tree's processes use
  std::vector<int> ns_pids;        // the GPU processes, as pids in their namespace
  std::vector<int> restore_tids;   // each one's driver restore thread, tid in its namespace
  // The gpushare shim's part (docs/GPUSHARE.md), when the GPU processes load it:
  // their device memory is in the chunk store, one manifest per process
  // (gpu/<ns pid>.chunks in the snapshot), and each is reached at its control
  // socket, whose name CRIU restores as it was.
  bool gpushare = false;
  std::string chunk_store;                  // the chunk store's root at checkpoint
  std::vector<std::string> control_sockets; // abstract names, one per ns_pids entry
  std::string shim;                         // the shim library the processes loaded
};

// How the snapshot was captured (schema 1.6; docs/CAPTURE-PATHS.md). An
// older snapshot reads as {"process", "process", ""}.
// How a checkpoint captures a workload (docs/CAPTURE-PATHS.md): the process
// (CRIU and the GPU state: a warm restore), the container's filesystem (its
// writable layer and caches: a cold start with warm caches), or both. kAuto
// is asked for, never taken: the checkpoint chooses the process where CRIU
// can take the tree, else the rootfs.
enum class CapturePath { kAuto, kProcess, kRootfs, kBoth };

// "auto", "process", "rootfs", "both": the names requests, annotations and
// gpusnap.json use.
std::string_view CapturePathName(CapturePath path);
// The path of `name` (one of those four), or nullopt.
std::optional<CapturePath> ParseCapturePath(std::string_view name);

struct CapturePathRecord {
  CapturePath path = CapturePath::kProcess;       // what it holds: never kAuto
  CapturePath requested = CapturePath::kProcess;  // what was asked: the same, or kAuto
  std::string reason;                 // why `auto` chose `path` ("the tree holds an io_uring instance ...")
  bool has_process() const { return path != CapturePath::kRootfs; }
  bool has_rootfs() const { return path == CapturePath::kRootfs || path == CapturePath::kBoth; }
};

struct RootfsSkipped {
  std::string path;    // container path
  std::string reason;
};

struct RootfsCache {
  std::string path;        // the directory in the container ("/root/.triton")
  std::string file;        // its archive in the snapshot ("caches/0.tar")
  bool mount = false;      // a mount point (a volume) rather than a directory of the root
  uint64_t entries = 0;
};

// The container's filesystem part of a rootfs or both snapshot (schema 1.6).
// No environment is recorded: it may hold secrets, and a restored command
// runs with its placeholder container's own (the pod's) environment.
struct RootfsRecord {
  std::string image;                    // the image reference the container ran
  std::string image_id;                 // its digest where the runtime recorded one, else empty
  std::vector<std::string> command;     // the container's process args
  std::string cwd;                      // and its working directory
  std::string upper;                    // the overlay's upper directory, as found
  std::vector<std::string> lowers;
  std::vector<std::string> excluded;    // the patterns (defaults, mount points, the user's)
  std::vector<std::string> excluded_paths;  // what they left out, topmost paths
  std::vector<RootfsSkipped> skipped;
  uint64_t entries = 0;                 // in rootfs-diff.tar
  uint64_t deleted = 0;                 // in deleted.files
  std::vector<RootfsCache> caches;
};

struct SnapshotMeta {
  int schema_major = kSchemaMajor;
  int schema_minor = kSchemaMinor;
  std::string id;
  std::string created;             // RFC 3339, UTC
  std::string hostname;
  std::string kernel;
  SnapshotSource source;
  std::string criu_version;
  bool tcp_established = false;    // restore must pass the same option
  bool shell_job = false;          // the tree's session was led from outside it; restore passes the same
  std::vector<int> listen_ports;   // TCP ports the tree listened on: a restore must bind them again
  std::vector<int> pids;           // every task in the tree (host pids at dump)
  uint64_t total_bytes = 0;        // sum of the files below
  std::string digest = "sha256";                // how files[].sha256 was computed (store/digest.h)
  std::map<std::string, FileDigest> files;      // path relative to the snapshot dir
  std::map<std::string, double> timings_s;      // phase -> seconds
  std::optional<SnapshotGpuState> gpu;
  CapturePathRecord capture_path;
  std::optional<RootfsRecord> rootfs;  // set exactly when capture_path.has_rootfs()
  std::optional<SnapshotOwner> owner;  // none: the snapshot belongs to no namespace
};

// From schema 1.5 on, the JSON carries `meta_sha256`, the SHA-256 of its own
// canonical form without that member (docs/snapshot-format.md).
std::string SnapshotMetaToJson(const SnapshotMeta& meta);
// Parses and validates every field: kNotSupported for another major version;
// kCorruption for a JSON syntax error (naming the byte), a `meta_sha256` that
// does not match, a missing required field, a wrong type or a value out of
// range (naming the field and quoting the value).
Result<SnapshotMeta> SnapshotMetaFromJson(std::string_view json);

// A snapshot id: 1-64 chars of [A-Za-z0-9._-], not starting with '.'.
bool IsValidSnapshotId(std::string_view id);

}  // namespace gpusnap
