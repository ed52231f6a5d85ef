// The snapshot store: <root>/snapshots/<id>/ published snapshots, and
// <root>/snapshots/.tmp-<id>/ snapshots being written.
//
// Publishing is atomic (write into .tmp-<id>, fsync every file and directory,
// one rename), so a reader never sees half a snapshot. A writer holds an flock
// on its .tmp directory for as long as it lives, past the publish (the lock
// moves with the directory); CleanStaleTemporaries removes every .tmp whose
// writer is gone (crashed, killed). A removal renames the snapshot to
// .tmp-.rm-<id> and holds the same lock while it deletes it.
//
// A snapshot holds regular files only, in the directories of the format
// (store/snapshot_tree.h); publishing and verification refuse anything else.
//
// Thread-safety: a Store is immutable; distinct PendingSnapshots may be used
// from distinct threads.
#pragma once

#include <string>
#include <vector>

#include "gpusnap/snapshot.h"
#include "gpusnap/status.h"
#include "store/digest.h"
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
    bool removing = false;  // a snapshot being removed (.tmp-.rm-<id>), not one being written
  };
  std::vector<Temporary> ListTemporaries() const;

  // Starts a snapshot. kAlreadyExists if `id` is taken.
  Result<PendingSnapshot> Begin(const std::string& id) const;

  // Published snapshots, oldest first. Unreadable ones are skipped and named in `warnings`.
  Result<std::vector<SnapshotMeta>> List(std::vector<std::string>* warnings = nullptr) const;

  // Reads and parses <id>/gpusnap.json. kNotFound if there is no such snapshot.
  Result<SnapshotMeta> Load(const std::string& id) const;

  // Checks that the snapshot holds exactly the files `meta` lists, all
  // regular, and nothing else but gpusnap.json, CRIU's accounting files and
  // the format's directories; then recomputes every digest. kCorruption
  // naming the first entry that differs (and its type, when it is not a
  // regular file).
  // `dir`: the snapshot's directory when it is not (yet) in the store (a
  // pull's staging); empty: SnapshotDir(meta.id). `pace`: beside a reader
  // of the same files (store/digest.h).
  Status Verify(const SnapshotMeta& meta, const std::string& dir = "", const DigestPace& pace = {}) const;

  // How long Remove waits for the checkpoint that wrote a snapshot to finish.
  static constexpr int kRemoveWaitMs = 60 * 1000;

  // Removes a published snapshot: waits (at most `wait_ms`, then kTimeout)
  // until its writer is done, renames it out of sight, then deletes it
  // holding its lock. Stale temporaries go on the way.
  Status Remove(const std::string& id, int wait_ms = kRemoveWaitMs) const;

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
  // directory into place. After success the destructor leaves it alone, and
  // the lock is held on the published directory until then: keep this object
  // until nothing writes into the snapshot any more (CRIU has exited).
  // kCorruption, before anything is renamed, naming an entry the format does
  // not allow.
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
