// libarchive's handles owned the C++ way, and the one way the rootfs code
// opens a tar to read it (the tar format only, no compression: a rootfs
// snapshot's archives are plain tars).
#pragma once

#include <archive.h>
#include <archive_entry.h>

#include <memory>
#include <string>

#include "gpusnap/status.h"

namespace gpusnap::rootfs {

struct ArchiveReadDeleter {
  void operator()(struct archive* a) const { archive_read_free(a); }
};
struct ArchiveWriteDeleter {
  void operator()(struct archive* a) const { archive_write_free(a); }
};
struct ArchiveEntryDeleter {
  void operator()(struct archive_entry* e) const { archive_entry_free(e); }
};
struct LinkResolverDeleter {
  void operator()(struct archive_entry_linkresolver* r) const { archive_entry_linkresolver_free(r); }
};

using ArchiveReader = std::unique_ptr<struct archive, ArchiveReadDeleter>;
using ArchiveWriter = std::unique_ptr<struct archive, ArchiveWriteDeleter>;

// The handle's last error, or a placeholder sentence when it has none.
std::string ArchiveError(struct archive* a);

// `tar_path` opened for reading, headers next. kCorruption naming it when it
// cannot be opened as a tar archive (a missing file included).
Result<ArchiveReader> OpenTarReader(const std::string& tar_path);

}  // namespace gpusnap::rootfs
