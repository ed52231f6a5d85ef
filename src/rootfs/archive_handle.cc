#include "rootfs/archive_handle.h"

namespace gpusnap::rootfs {

std::string ArchiveError(struct archive* a) {
  const char* s = archive_error_string(a);
  return s != nullptr ? s : "unknown libarchive error";
}

Result<ArchiveReader> OpenTarReader(const std::string& tar_path) {
  ArchiveReader a(archive_read_new());
  if (!a) return Status::Error(Code::kInternal, "libarchive: out of memory");
  archive_read_support_format_tar(a.get());
  // Large reads: a cache archive is often model weights.
  if (archive_read_open_filename(a.get(), tar_path.c_str(), 1 << 20) != ARCHIVE_OK)
    return Status::Error(Code::kCorruption, "`{}` cannot be read as a tar archive: {}", tar_path,
                         ArchiveError(a.get()));
  return a;
}

}  // namespace gpusnap::rootfs
