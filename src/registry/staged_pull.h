// A pull in two halves, for a restore that does not wait for all of it:
// Begin fetches the manifest, the metadata and the chunk manifests into its
// staging directory, then the other files while the chunks arrive in the
// chunk store beside them (in the order a restore loads them), and returns
// with every file in place while the chunks go on arriving as the caller
// goes on with what it has; Publish waits for the chunks and makes the snapshot appear in
// the store (one rename). Pull (gpusnap/distribution.h) is Begin + Publish.
//
// Until Publish, nothing of the pull is seen by `ls` or a restore by id:
// whoever restores from the staging directory meanwhile holds this object.
// Destroying it unpublished stops the chunks and leaves the staging for the
// next pull to go on from.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "chunks/chunk_lock.h"
#include "chunks/chunk_store.h"
#include "gpusnap/distribution.h"
#include "gpusnap/snapshot.h"
#include "registry/artifact.h"
#include "registry/client.h"
#include "registry/encryption.h"
#include "registry/reference.h"
#include "registry/sources.h"
#include "registry/transfer.h"
#include "util/lock_file.h"
#include "util/mutex.h"

namespace gpusnap::registry {

class StagedPull {
 public:
  static Result<std::unique_ptr<StagedPull>> Begin(const PullOptions& options);
  ~StagedPull();

  const SnapshotMeta& meta() const { return meta_; }
  // The snapshot's directory: the staging, or the store's when it was there already.
  const std::string& dir() const { return dir_; }
  bool already_present() const { return result_.already_present; }
  // The chunks (32 hex) not in the store when the pull began: still arriving.
  const std::set<std::string>& arriving() const { return arriving_; }

  // Every chunk arrived (or the first failure).
  Status WaitForChunks();
  // OK while the chunks arrive or once all have; a chunk's failure as soon
  // as there is one. Thread-safe.
  Status ChunkFailure() const;
  // Waits for the chunks, checks the staging against the format, and
  // publishes it. A filesystem that refused (a full disk) takes back what
  // the pull wrote.
  Result<TransferResult> Publish();

 private:
  StagedPull() = default;
  Status FetchFiles(const std::vector<const ArtifactFile*>& files);
  void StartChunks(std::vector<const ArtifactChunk*> missing);
  void StopChunks();
  // What this pull wrote, taken back: its staging and the chunks it stored.
  void TakeBack();

  PullOptions options_;
  Reference ref_;
  std::string store_root_;
  std::unique_ptr<Sources> sources_;  // where the manifest and the blobs come from
  Artifact artifact_;
  std::optional<OpenedBlob> config_opened_;  // an encrypted artifact's config: its key
  SnapshotMeta meta_;
  std::string meta_json_;
  std::vector<std::string> chunked_digest_files_;  // digested once in, before publishing
  std::string dir_, final_dir_;
  std::optional<LockFile> turn_;
  std::optional<chunks::ChunkStoreLock> chunk_lock_;
  std::optional<chunks::ChunkStore> chunks_;
  std::unique_ptr<TransferMeter> meter_;
  std::set<std::string> arriving_;
  TransferResult result_;
  Mutex written_mu_;
  std::vector<std::string> written_chunks_ GUARDED_BY(written_mu_);
  std::atomic<bool> cancel_{false};
  mutable Mutex failure_mu_;
  Status first_failure_ GUARDED_BY(failure_mu_);
  Status chunks_status_;
  std::thread chunks_thread_;
  bool published_ = false;
};

}  // namespace gpusnap::registry
