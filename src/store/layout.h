// The one place that names the files inside a snapshot directory
// (<store>/snapshots/<id>/). Layout, docs/snapshot-format.md:
//
//   gpusnap.json     metadata and the SHA-256 of every other file
//   checkpoint/      CRIU images      ┐ the Kubernetes/CRI-O/Podman
//   config.dump      container config │ checkpoint archive layout, so
//   spec.dump        OCI runtime spec ┘ checkpointctl reads it
//   dump.log         CRIU's log of the dump (not digested: see below)
//   stats-dump       CRIU's timing of the dump (likewise)
//   rootfs-diff.tar  a rootfs capture: the container's  ┐ as CRI-O and
//   deleted.files    writable layer and its deletions   ┘ checkpointctl name them
//   caches/<n>.tar   one archive per cache directory (docs/CAPTURE-PATHS.md)
#pragma once

#include <string_view>

namespace gpusnap {

// The names, as static members so that a use reads SnapshotFiles::kMetaFile.
struct SnapshotFiles {
  static constexpr const char* kMetaFile = "gpusnap.json";
  static constexpr const char* kCheckpointDir = "checkpoint";
  static constexpr const char* kGpuDir = "gpu";  // gpushare manifests, <ns pid>.chunks
  static constexpr const char* kConfigDump = "config.dump";
  static constexpr const char* kSpecDump = "spec.dump";
  static constexpr const char* kDumpLog = "dump.log";
  static constexpr const char* kStatsDump = "stats-dump";
  static constexpr const char* kRootfsDiffTar = "rootfs-diff.tar";
  static constexpr const char* kDeletedFiles = "deleted.files";
  static constexpr const char* kCachesDir = "caches";

  // CRIU's own accounting, which it keeps writing after the post-dump
  // notification at which gpusnap publishes. They carry no state a restore
  // reads, so they are left out of the digests (docs/snapshot-format.md).
  static bool IsCriuAccountingFile(std::string_view name) { return name == kDumpLog || name == kStatsDump; }
};

}  // namespace gpusnap
