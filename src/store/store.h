// The snapshot store: <root>/snapshots/<id>/ published snapshots, and
// <root>/snapshots/.tmp-<id>/ snapshots being written.
//
// Publishing is atomic (write into .tmp-<id>, fsync every file and directory,
// one rename), so a reader never sees half a snapshot. A writer holds an flock
// on its .tmp directory for as long as it lives; CleanStaleTemporaries removes
// every .tmp whose writer is gone (crashed, killed).
//
// Thread-safety: a Store is immutable; distinct PendingSnapshots may be used
// from distinct threads.
#pragma once

#include <string>
#include <vector>

#include "gpusnap/snapshot.h"
#include "gpusnap/status.h"
#include "util/fd.h"

namespace gpusnap {

class PendingSnapshot;

class Store {
 public:
  // Opens the store at `root`. With `for_writing`, creates it if missing and
  // checks that it is writable (kIoError naming the directory otherwise).
  static Result<Store> Open(const std::string& root, bool for_writing);

  const std::string& root() const { return root_; }
  std::string SnapshotsDir() const { return root_ + "/snapshots"; }
  std::string SnapshotDir(const std::string& id) const { return SnapshotsDir() + "/" + id; }

  // Removes temporary directories that no live writer holds. Returns how many.
  int CleanStaleTemporaries() const;

  // The temporary directories: snapshots being written (`live`: their writer
  // holds them) and the leftovers CleanStaleTemporaries would remove.
  struct Temporary {
    std::string dir;
    bool live = false;
  };
  std::vector<Temporary> ListTemporaries() const;

  // Starts a snapshot. kAlreadyExists if `id` is taken.
  Result<PendingSnapshot> Begin(const std::string& id) const;

  // Published snapshots, oldest first. Unreadable ones are skipped and named in `warnings`.
  Result<std::vector<SnapshotMeta>> List(std::vector<std::string>* warnings = nullptr) const;

  // Reads and parses <id>/gpusnap.json. kNotFound if there is no such snapshot.
  Result<SnapshotMeta> Load(const std::string& id) const;

  // Recomputes every digest recorded in `meta` and checks that no file was
  // added or removed. kCorruption naming the first file that differs.
  Status Verify(const SnapshotMeta& meta) const;

  // Removes a published snapshot: first renamed out of sight, then deleted.
  Status Remove(const std::string& id) const;

 private:
  explicit Store(std::string root) : root_(std::move(root)) {}
  std::string root_;
};

// A snapshot being written. Destroying it without Publish() deletes it.
class PendingSnapshot {
 public:
  PendingSnapshot(PendingSnapshot&&) noexcept = default;
  PendingSnapshot& operator=(PendingSnapshot&&) noexcept = default;
  ~PendingSnapshot();

  const std::string& dir() const { return tmp_dir_; }
  const std::string& id() const { return id_; }
  int dir_fd() const { return lock_fd_.get(); }

  // Records size and SHA-256 of every file into meta.files and
  // meta.total_bytes, writes gpusnap.json, syncs everything and renames the
  // directory into place. After success the destructor leaves it alone.
  Status Publish(SnapshotMeta& meta);

 private:
  friend class Store;
  PendingSnapshot(std::string id, std::string tmp_dir, std::string final_dir, UniqueFd lock_fd)
      : id_(std::move(id)), tmp_dir_(std::move(tmp_dir)), final_dir_(std::move(final_dir)), lock_fd_(std::move(lock_fd)) {}
  std::string id_;
  std::string tmp_dir_;
  std::string final_dir_;
  UniqueFd lock_fd_;  // flock'd for our lifetime
  bool published_ = false;
};

// A fresh snapshot id: <prefix>-<UTC yyyymmdd-hhmmss>-<4 random hex>.
std::string NewSnapshotId(std::string_view prefix);

}  // namespace gpusnap
