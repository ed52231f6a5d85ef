#include "rootfs/diff_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>

#include <set>

#include <nlohmann/json.hpp>

#include "rootfs/archive_handle.h"
#include "rootfs/beneath.h"
#include "rootfs/tree_archive.h"
#include "util/fd.h"
#include "util/files.h"

namespace gpusnap::rootfs {

namespace {

TreeOrigin WritableLayer() { return {"/", "the writable layer"}; }

}  // namespace

Result<UpperTree> ScanUpperDir(const std::string& upper_dir, const PathMatcher& exclusions) {
  UniqueFd root(::open(upper_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) return Status::Errno(errno, "opening the writable layer `{}`", upper_dir);
  Result<UpperTree> tree = ScanTree(root.get(), WritableLayer(), exclusions);
  if (!tree.ok()) return tree.status().Wrap(fmt::format("reading the writable layer `{}`", upper_dir));
  return tree;
}

Result<std::vector<std::string>> LowerNames(const std::vector<std::string>& lowers, const std::string& dir,
                                            std::string_view overlay_prefix) {
  std::set<std::string> names, hidden;
  const std::string opaque_attr = std::string(overlay_prefix) + "opaque";
  for (const std::string& layer : lowers) {
    UniqueFd root(::open(layer.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!root.valid()) return Status::Errno(errno, "opening the lower layer `{}`", layer);
    UniqueFd d(OpenBeneath(root.get(), dir, O_RDONLY | O_DIRECTORY));
    if (!d.valid()) {
      if (errno == ENOENT) continue;  // this layer does not have it
      if (errno == ENOTDIR || errno == ELOOP || errno == EXDEV) break;  // a file, a whiteout or a link hides the rest
      return Status::Errno(errno, "opening `{}` in the lower layer `{}`", ContainerPath(dir), layer);
    }
    GPUSNAP_ASSIGN_OR_RETURN(std::vector<std::string> here, DirectoryNames(d.get(), layer + "/" + dir));
    for (const std::string& name : here) {
      struct stat st;
      if (::fstatat(d.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
      if (S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0)) {
        hidden.insert(name);
        continue;
      }
      if (!hidden.count(name)) names.insert(name);
    }
    char value[2] = {};
    ssize_t n = ::fgetxattr(d.get(), opaque_attr.c_str(), value, sizeof value);
    if (n == 1 && value[0] == 'y') break;  // the layers below are hidden here
  }
  return std::vector<std::string>(names.begin(), names.end());
}

Result<DiffWritten> WriteRootfsDiff(const std::string& upper_dir, const UpperTree& tree, const DiffPlan& plan,
                                    const DiffFiles& files) {
  UniqueFd root(::open(upper_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) return Status::Errno(errno, "opening the writable layer `{}`", upper_dir);
  GPUSNAP_ASSIGN_OR_RETURN(TreeArchiveWritten tar,
                           WriteTreeArchive(root.get(), WritableLayer(), tree, plan.archived, files.tar_path));
  nlohmann::json deleted = plan.deleted;
  GPUSNAP_RETURN_IF_ERROR(WriteFileSynced(files.deleted_files_path, deleted.dump(2)));
  return DiffWritten{tar.entries, tar.data_bytes, tar.archive_bytes};
}

Result<std::vector<ArchiveEntry>> ListArchive(const std::string& tar_path) {
  GPUSNAP_ASSIGN_OR_RETURN(ArchiveReader a, OpenTarReader(tar_path));
  std::vector<ArchiveEntry> out;
  for (;;) {
    struct archive_entry* e = nullptr;
    int r = archive_read_next_header(a.get(), &e);
    if (r == ARCHIVE_EOF) break;
    // A header that fails its checksum is ARCHIVE_RETRY: corrupt as well.
    if (r == ARCHIVE_RETRY || r < ARCHIVE_WARN)
      return Status::Error(Code::kCorruption, "`{}` is no intact tar archive (after {} entries): {}", tar_path,
                           out.size(), ArchiveError(a.get()));
    ArchiveEntry entry;
    const char* name = archive_entry_pathname(e);
    entry.path = name != nullptr ? name : "";
    entry.kind = FileKindOfMode(archive_entry_filetype(e));
    if (const char* hard = archive_entry_hardlink(e)) {
      entry.hardlink = true;
      entry.link_target = hard;
    } else if (const char* sym = archive_entry_symlink(e)) {
      entry.link_target = sym;
    }
    out.push_back(std::move(entry));
    if (archive_read_data_skip(a.get()) < ARCHIVE_WARN)
      return Status::Error(Code::kCorruption, "`{}` is no intact tar archive (in `{}`): {}", tar_path,
                           out.back().path, ArchiveError(a.get()));
  }
  return out;
}

}  // namespace gpusnap::rootfs
