// Small filesystem effects shared by the store, the snapshot writer and the
// workload registry. Every function returns a Status naming the path it failed on.
#pragma once

#include <cstdint>

#include <string>
#include <vector>

#include "gpusnap/status.h"

namespace gpusnap {

Result<std::string> ReadFile(const std::string& path);

// Pure. Whether a file of `mode` is for its owner only (no group or other
// bits): what a file holding a secret must be.
constexpr bool IsOwnerOnly(uint32_t mode) { return (mode & 077) == 0; }

// A file that holds a secret (a key, a token): a regular file that neither
// group nor others may read or write, else kInvalidArgument naming `what`,
// the path and its mode; larger than `max_bytes` (0: any size) is refused
// too. The content is never in an error.
Result<std::string> ReadOwnerOnlyFile(const std::string& path, std::string_view what, uint64_t max_bytes = 0);

// Writes `data` to `path` durably: a temporary sibling, fsync, rename, fsync of
// the directory. Readers see the old content or the new, never a mix.
Status WriteFileAtomic(const std::string& path, std::string_view data, int mode = 0644);

// Writes `data` to a new file and fsyncs it (no rename: for files inside a
// directory that is itself published by rename).
Status WriteFileSynced(const std::string& path, std::string_view data);

Status FsyncPath(const std::string& path);   // file or directory
// Writes all of `data` to `fd` (retrying short writes and EINTR); errors name `path`.
Status WriteAll(int fd, std::string_view data, const std::string& path);
// Publishes a directory written in place: fsyncs every directory under `dir`
// and `dir` itself, renames it to `final_dir`, fsyncs the parent. A rename
// that fails (EEXIST/ENOTEMPTY when `final_dir` is taken) keeps its errno.
Status SyncAndRenameTree(const std::string& dir, const std::string& final_dir);
// Creates `path` and any missing parents, like `mkdir -p`. Every directory it
// creates gets exactly `mode` (set after mkdir, so the umask does not narrow
// it); directories that already exist are left as they are. A component that
// exists but is not a directory is an error naming it.
Status MakeDirs(const std::string& path, int mode = 0755);
// Removes a tree; missing is fine. Does not follow symlinks.
Status RemoveTree(const std::string& path);

// Regular files under `root`, as paths relative to it, sorted.
Result<std::vector<std::string>> ListFilesRecursive(const std::string& root);

}  // namespace gpusnap
