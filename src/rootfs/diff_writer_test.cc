#include "rootfs/diff_writer.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "util/files.h"
#include "util/temp_dir_testing.h"

namespace gpusnap::rootfs {
namespace {

void Write(const std::string& path, const std::string& data) {
  ASSERT_TRUE(MakeDirs(path.substr(0, path.rfind('/'))).ok()) << path;
  ASSERT_TRUE(WriteFileSynced(path, data).ok()) << path;
}

struct TarFile {
  std::string kind;  // "file", "dir", "symlink", "hardlink"
  std::string link;  // symlink or hard link target
  std::string data;
  std::map<std::string, std::string> xattrs;
};

// Every entry of a tar, by its path, read back with libarchive.
std::map<std::string, TarFile> ReadTar(const std::string& path) {
  std::map<std::string, TarFile> out;
  struct archive* a = archive_read_new();
  archive_read_support_format_tar(a);
  EXPECT_EQ(archive_read_open_filename(a, path.c_str(), 1 << 16), ARCHIVE_OK) << archive_error_string(a);
  struct archive_entry* e = nullptr;
  while (archive_read_next_header(a, &e) == ARCHIVE_OK) {
    TarFile f;
    if (const char* hard = archive_entry_hardlink(e)) {
      f.kind = "hardlink";
      f.link = hard;
    } else if (archive_entry_filetype(e) == AE_IFDIR) {
      f.kind = "dir";
    } else if (archive_entry_filetype(e) == AE_IFLNK) {
      f.kind = "symlink";
      f.link = archive_entry_symlink(e);
    } else {
      f.kind = "file";
    }
    archive_entry_xattr_reset(e);
    const char* name;
    const void* value;
    size_t size;
    while (archive_entry_xattr_next(e, &name, &value, &size) == ARCHIVE_OK)
      f.xattrs[name] = std::string(static_cast<const char*>(value), size);
    char buf[4096];
    la_ssize_t n;
    while ((n = archive_read_data(a, buf, sizeof buf)) > 0) f.data.append(buf, static_cast<size_t>(n));
    out[archive_entry_pathname(e)] = f;
  }
  archive_read_free(a);
  return out;
}

// The diff of all of `upper`: scanned, planned and written, nothing excluded.
void WriteWholeDiff(const std::string& upper, const DiffFiles& files) {
  auto tree = ScanUpperDir(upper, PathMatcher());
  ASSERT_TRUE(tree.ok()) << tree.status().ToString();
  auto plan = DiffPlanOf(*tree, PathMatcher());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto written = WriteRootfsDiff(upper, *tree, *plan, files);
  ASSERT_TRUE(written.ok()) << written.status().ToString();
}

// A writable layer of plain files, a symbolic link and a hard link: needs no root.
TEST(RootfsDiffWriter, FilesLinksAndDirectoriesRoundTrip) {
  TempDir tmp{"rootfs-writer"};
  ASSERT_FALSE(tmp.path().empty());
  const std::string upper = tmp.path() + "/upper";
  Write(upper + "/etc/app.conf", "threads=8\n");
  Write(upper + "/root/.cache/compiled/kernel.bin", std::string(100000, 'k'));
  Write(upper + "/tmp/scratch", "gone soon");
  ASSERT_EQ(::symlink("../usr/share/alt", (upper + "/etc/alt").c_str()), 0);
  ASSERT_EQ(::link((upper + "/etc/app.conf").c_str(), (upper + "/etc/app2.conf").c_str()), 0);
  ASSERT_EQ(::chmod((upper + "/etc/app.conf").c_str(), 0640), 0);

  auto exclusions = PathMatcher::Make({"/tmp"});
  ASSERT_TRUE(exclusions.ok());
  auto tree = ScanUpperDir(upper, *exclusions);
  ASSERT_TRUE(tree.ok()) << tree.status().ToString();
  EXPECT_EQ(tree->excluded, (std::vector<std::string>{"/tmp"}));
  auto plan = DiffPlanOf(*tree, *exclusions);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->archived_bytes, 100000u + 2 * 10u);

  DiffFiles files{tmp.path() + "/rootfs-diff.tar", tmp.path() + "/deleted.files"};
  auto written = WriteRootfsDiff(upper, *tree, *plan, files);
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  EXPECT_EQ(written->entries, 8u);
  EXPECT_EQ(written->data_bytes, 100000u + 10u);  // the hard link's data once

  std::map<std::string, TarFile> tar = ReadTar(files.tar_path);
  std::vector<std::string> names;
  for (const auto& [name, f] : tar) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"etc/", "etc/alt", "etc/app.conf", "etc/app2.conf", "root/",
                                             "root/.cache/", "root/.cache/compiled/",
                                             "root/.cache/compiled/kernel.bin"}));
  EXPECT_EQ(tar["etc/app.conf"].data, "threads=8\n");
  EXPECT_EQ(tar["etc/app2.conf"].kind, "hardlink");
  EXPECT_EQ(tar["etc/app2.conf"].link, "etc/app.conf");
  EXPECT_EQ(tar["etc/alt"].kind, "symlink");
  EXPECT_EQ(tar["etc/alt"].link, "../usr/share/alt");
  EXPECT_EQ(tar["root/.cache/compiled/kernel.bin"].data, std::string(100000, 'k'));
  EXPECT_EQ(*ReadFile(files.deleted_files_path), "[]");

  // The restore's check lists it the same way and accepts it.
  auto listed = ListArchive(files.tar_path);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->size(), 8u);
  ExtractionPlan extraction = PlanExtraction(*listed);
  EXPECT_TRUE(PlanStatus(extraction, "rootfs-diff.tar").ok()) << PlanStatus(extraction, "rootfs-diff.tar").ToString();

  // A second capture into the same file is refused, not appended.
  EXPECT_FALSE(WriteRootfsDiff(upper, *tree, *plan, files).ok());
}

TEST(RootfsDiffWriter, ACutArchiveIsCorrupt) {
  TempDir tmp{"rootfs-writer"};
  const std::string upper = tmp.path() + "/upper";
  Write(upper + "/big", std::string(20000, 'b'));
  DiffFiles files{tmp.path() + "/rootfs-diff.tar", tmp.path() + "/deleted.files"};
  ASSERT_NO_FATAL_FAILURE(WriteWholeDiff(upper, files));
  ASSERT_EQ(::truncate(files.tar_path.c_str(), 4096), 0);
  auto listed = ListArchive(files.tar_path);
  EXPECT_EQ(listed.status().code(), Code::kCorruption) << listed.status().ToString();
  Write(tmp.path() + "/not.tar", "this is not a tar archive, not at all, and it goes on for a while............");
  EXPECT_EQ(ListArchive(tmp.path() + "/not.tar").status().code(), Code::kCorruption);
}

// libarchive answers a header that fails its checksum with ARCHIVE_RETRY,
// again at every call: corrupt, not an entry to list (nor a loop).
TEST(RootfsDiffWriter, AHeaderFailingItsChecksumIsCorrupt) {
  TempDir tmp{"rootfs-writer"};
  const std::string upper = tmp.path() + "/upper";
  Write(upper + "/a", std::string(5000, 'a'));
  Write(upper + "/b", "b");
  DiffFiles files{tmp.path() + "/rootfs-diff.tar", tmp.path() + "/deleted.files"};
  ASSERT_NO_FATAL_FAILURE(WriteWholeDiff(upper, files));
  auto bytes = ReadFile(files.tar_path);
  ASSERT_TRUE(bytes.ok());
  std::string flipped = *bytes;
  flipped[512 + 5120 + 1] ^= 0x5a;  // in the name of `b`, after `a`'s header and data
  ASSERT_TRUE(WriteFileAtomic(files.tar_path, flipped).ok());
  auto listed = ListArchive(files.tar_path);
  EXPECT_EQ(listed.status().code(), Code::kCorruption) << listed.status().ToString();
  EXPECT_NE(listed.status().message().find("(after 1 entries)"), std::string::npos) << listed.status().message();
}

// Whiteouts and an opaque directory, as overlayfs writes them: mknod of a
// 0/0 character device and the trusted.overlay.opaque xattr need root.
TEST(RootfsDiffWriter, WhiteoutsAndOpaqueDirectoriesBecomeDeletedFiles) {
  if (::geteuid() != 0)
    GTEST_SKIP() << "needs root: an overlay whiteout is a 0/0 character device (mknod) and an opaque directory "
                    "carries a trusted.overlay.opaque xattr";
  TempDir tmp{"rootfs-writer"};
  const std::string upper = tmp.path() + "/upper", lower = tmp.path() + "/lower";
  Write(lower + "/etc/motd", "welcome");
  Write(lower + "/var/cache/apt/pkgcache.bin", "apt");
  Write(lower + "/var/cache/fresh", "old fresh");
  Write(lower + "/var/cache/debconf", "d");
  Write(upper + "/var/cache/fresh", "new fresh");
  ASSERT_TRUE(MakeDirs(upper + "/etc").ok());
  ASSERT_EQ(::mknod((upper + "/etc/motd").c_str(), S_IFCHR | 0, makedev(0, 0)), 0) << std::strerror(errno);
  if (::setxattr((upper + "/var/cache").c_str(), "trusted.overlay.opaque", "y", 1, 0) != 0)
    GTEST_SKIP() << "the filesystem of " << tmp.path() << " takes no trusted.* xattrs: " << std::strerror(errno);
  bool user_xattrs = ::setxattr((upper + "/var/cache/fresh").c_str(), "user.origin", "test", 4, 0) == 0;
  if (!user_xattrs && errno != ENOTSUP) FAIL() << std::strerror(errno);

  auto tree = ScanUpperDir(upper, PathMatcher());
  ASSERT_TRUE(tree.ok()) << tree.status().ToString();
  EXPECT_EQ(OpaqueDirectories(*tree), (std::vector<std::string>{"var/cache"}));
  auto lower_names = LowerNames({lower}, "var/cache");
  ASSERT_TRUE(lower_names.ok()) << lower_names.status().ToString();
  EXPECT_EQ(*lower_names, (std::vector<std::string>{"apt", "debconf", "fresh"}));
  auto plan = DiffPlanOf(*tree, PathMatcher(), {{"var/cache", *lower_names}});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->deleted, (std::vector<std::string>{"/etc/motd", "/var/cache/apt", "/var/cache/debconf"}));

  DiffFiles files{tmp.path() + "/rootfs-diff.tar", tmp.path() + "/deleted.files"};
  auto written = WriteRootfsDiff(upper, *tree, *plan, files);
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  std::map<std::string, TarFile> tar = ReadTar(files.tar_path);
  // The whiteout is no entry; the opaque directory is, without the overlay's xattr.
  EXPECT_EQ(tar.count("etc/motd"), 0u);
  ASSERT_EQ(tar.count("var/cache/"), 1u);
  EXPECT_TRUE(tar["var/cache/"].xattrs.empty());
  EXPECT_EQ(tar["var/cache/fresh"].data, "new fresh");
  if (user_xattrs) {
    EXPECT_EQ(tar["var/cache/fresh"].xattrs["user.origin"], "test");
  }
  EXPECT_EQ(*ReadFile(files.deleted_files_path),
            "[\n  \"/etc/motd\",\n  \"/var/cache/apt\",\n  \"/var/cache/debconf\"\n]");

  // A lower layer's own whiteout hides the name from the layers below it.
  const std::string top = tmp.path() + "/lower-top";
  ASSERT_TRUE(MakeDirs(top + "/var/cache").ok());
  ASSERT_EQ(::mknod((top + "/var/cache/debconf").c_str(), S_IFCHR | 0, makedev(0, 0)), 0);
  auto hidden = LowerNames({top, lower}, "var/cache");
  ASSERT_TRUE(hidden.ok()) << hidden.status().ToString();
  EXPECT_EQ(*hidden, (std::vector<std::string>{"apt", "fresh"}));
}

// An archive made to escape (as a crafted snapshot would hold it): listed
// without extracting, and refused naming the entries.
TEST(RootfsDiffWriter, ACraftedArchiveIsRefusedBeforeAnythingIsWritten) {
  TempDir tmp{"rootfs-writer"};
  const std::string path = tmp.path() + "/rootfs-diff.tar";
  struct archive* a = archive_write_new();
  ASSERT_EQ(archive_write_set_format_pax_restricted(a), ARCHIVE_OK);
  ASSERT_EQ(archive_write_open_filename(a, path.c_str()), ARCHIVE_OK);
  auto add = [&](const char* name, mode_t type, const char* symlink, const std::string& data) {
    struct archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, name);
    archive_entry_set_filetype(e, type);
    archive_entry_set_perm(e, 0644);
    if (symlink != nullptr) archive_entry_set_symlink(e, symlink);
    archive_entry_set_size(e, static_cast<la_int64_t>(data.size()));
    EXPECT_EQ(archive_write_header(a, e), ARCHIVE_OK) << archive_error_string(a);
    if (!data.empty()) archive_write_data(a, data.data(), data.size());
    archive_entry_free(e);
  };
  add("etc/app.conf", AE_IFREG, nullptr, "ok");
  add("escape", AE_IFLNK, "/etc", "");
  add("escape/cron.d/evil", AE_IFREG, nullptr, "* * * * * root sh");
  add("../../outside", AE_IFREG, nullptr, "x");
  ASSERT_EQ(archive_write_close(a), ARCHIVE_OK);
  archive_write_free(a);

  auto listed = ListArchive(path);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->size(), 4u);
  ExtractionPlan plan = PlanExtraction(*listed, {"/escape/passwd"});
  ASSERT_EQ(plan.refused.size(), 3u);
  EXPECT_EQ(plan.refused[0].entry, "escape/cron.d/evil");
  EXPECT_EQ(plan.refused[1].entry, "../../outside");
  EXPECT_EQ(plan.refused[2].entry, "/escape/passwd");
  Status st = PlanStatus(plan, "rootfs-diff.tar");
  EXPECT_EQ(st.code(), Code::kCorruption);
  EXPECT_NE(st.message().find("`escape/cron.d/evil` lies under `escape`, which the archive makes a symbolic link (to "
                              "`/etc`)"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("; also refused: `../../outside`, `/escape/passwd`; nothing was applied"),
            std::string::npos)
      << st.message();
}

TEST(RootfsDiffWriter, AnEntrySwappedForALinkIsNotFollowed) {
  TempDir tmp{"rootfs-writer"};
  const std::string upper = tmp.path() + "/upper";
  Write(upper + "/data/file", "inside");
  Write(tmp.path() + "/outside/file", "secret of the host");
  auto tree = ScanUpperDir(upper, PathMatcher());
  ASSERT_TRUE(tree.ok()) << tree.status().ToString();
  auto plan = DiffPlanOf(*tree, PathMatcher());
  ASSERT_TRUE(plan.ok());
  // The container swaps the directory for a link to the host after the scan.
  ASSERT_TRUE(RemoveTree(upper + "/data").ok());
  ASSERT_EQ(::symlink((tmp.path() + "/outside").c_str(), (upper + "/data").c_str()), 0);
  DiffFiles files{tmp.path() + "/rootfs-diff.tar", tmp.path() + "/deleted.files"};
  auto written = WriteRootfsDiff(upper, *tree, *plan, files);
  ASSERT_FALSE(written.ok());
  EXPECT_NE(written.status().message().find("`/data`"), std::string::npos) << written.status().message();
}

}  // namespace
}  // namespace gpusnap::rootfs
