#include "rootfs/applier.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>

#include "rootfs/diff_writer.h"
#include "util/fd.h"
#include "util/files.h"
#include "util/temp_dir_testing.h"

namespace gpusnap::rootfs {
namespace {

void Write(const std::string& path, const std::string& data) {
  ASSERT_TRUE(MakeDirs(path.substr(0, path.rfind('/'))).ok()) << path;
  ASSERT_TRUE(WriteFileSynced(path, data).ok()) << path;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

bool IsDir(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

UniqueFd OpenPath(const std::string& dir) { return UniqueFd(::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC)); }

// An archive as a crafted (or another tool's) snapshot would hold it.
class TarBuilder {
 public:
  explicit TarBuilder(const std::string& path) : a_(archive_write_new()) {
    EXPECT_EQ(archive_write_set_format_pax_restricted(a_), ARCHIVE_OK);
    EXPECT_EQ(archive_write_open_filename(a_, path.c_str()), ARCHIVE_OK) << archive_error_string(a_);
  }
  ~TarBuilder() { archive_write_free(a_); }
  TarBuilder& File(const char* name, const std::string& data, mode_t perm = 0644) {
    return Add(name, AE_IFREG, perm, nullptr, nullptr, data);
  }
  TarBuilder& Dir(const char* name, mode_t perm = 0755) { return Add(name, AE_IFDIR, perm, nullptr, nullptr, ""); }
  TarBuilder& Symlink(const char* name, const char* target) {
    return Add(name, AE_IFLNK, 0777, target, nullptr, "");
  }
  TarBuilder& Hardlink(const char* name, const char* target) {
    return Add(name, AE_IFREG, 0644, nullptr, target, "");
  }
  void Close() { EXPECT_EQ(archive_write_close(a_), ARCHIVE_OK) << archive_error_string(a_); }

 private:
  TarBuilder& Add(const char* name, mode_t type, mode_t perm, const char* symlink, const char* hardlink,
                  const std::string& data) {
    struct archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, name);
    archive_entry_set_filetype(e, type);
    archive_entry_set_perm(e, perm);
    archive_entry_set_uid(e, ::geteuid());
    archive_entry_set_gid(e, ::getegid());
    archive_entry_set_mtime(e, 1700000000, 0);
    if (symlink != nullptr) archive_entry_set_symlink(e, symlink);
    if (hardlink != nullptr) archive_entry_set_hardlink(e, hardlink);
    archive_entry_set_size(e, static_cast<la_int64_t>(data.size()));
    EXPECT_EQ(archive_write_header(a_, e), ARCHIVE_OK) << archive_error_string(a_);
    if (!data.empty()) {
      EXPECT_EQ(archive_write_data(a_, data.data(), data.size()), static_cast<la_ssize_t>(data.size()));
    }
    archive_entry_free(e);
    return *this;
  }
  struct archive* a_;
};

// The restore's two steps, as it runs them: check, then apply.
Result<Applied> CheckAndApply(const std::string& target, const std::string& tar,
                              const std::vector<std::string>& deleted = {}) {
  GPUSNAP_ASSIGN_OR_RETURN(ExtractionPlan plan, CheckArchive(tar, deleted, "rootfs-diff.tar"));
  UniqueFd fd = OpenPath(target);
  if (!fd.valid()) return Status::Errno(errno, "opening `{}`", target);
  return ApplyArchive(fd.get(), tar, plan);
}

// A writable layer captured as rootfs-diff.tar and deleted.files, applied
// over a root that holds the image's files: the diff's files replace the
// image's, the deleted paths go (a directory whole; a missing one is fine),
// the rest stays.
TEST(RootfsApplier, RootfsDiffAppliedOverAnImageWithItsDeletions) {
  TempDir tmp{"rootfs-apply"};
  ASSERT_FALSE(tmp.path().empty());
  const std::string upper = tmp.path() + "/upper", root = tmp.path() + "/root";
  Write(upper + "/etc/app.conf", "threads=8\n");
  Write(upper + "/root/.cache/compiled/kernel.bin", std::string(300000, 'k'));
  ASSERT_EQ(::symlink("app.conf", (upper + "/etc/app.link").c_str()), 0);
  ASSERT_EQ(::link((upper + "/etc/app.conf").c_str(), (upper + "/etc/app.hard").c_str()), 0);
  Write(root + "/etc/app.conf", "threads=1\n");  // the image's, replaced
  Write(root + "/etc/keep", "the image's own");
  Write(root + "/etc/motd", "welcome");
  Write(root + "/var/cache/apt/archives/partial/x.deb", "deb");
  Write(root + "/var/cache/debconf", "d");
  ASSERT_EQ(::symlink("/var/cache", (root + "/var/cache/self").c_str()), 0);  // removed as the link, not followed

  auto tree = ScanUpperDir(upper, PathMatcher());
  ASSERT_TRUE(tree.ok()) << tree.status().ToString();
  auto plan = DiffPlanOf(*tree, PathMatcher());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  // What whiteouts and an opaque directory give (making them needs root: the
  // writer's own test covers that).
  plan->deleted = {"/etc/motd", "/never/was/here", "/var/cache/apt", "/var/cache/self"};
  DiffFiles files{tmp.path() + "/rootfs-diff.tar", tmp.path() + "/deleted.files"};
  ASSERT_TRUE(WriteRootfsDiff(upper, *tree, *plan, files).ok());

  auto deleted = ReadDeletedFiles(files.deleted_files_path);
  ASSERT_TRUE(deleted.ok()) << deleted.status().ToString();
  EXPECT_EQ(*deleted, plan->deleted);
  auto applied = CheckAndApply(root, files.tar_path, *deleted);
  ASSERT_TRUE(applied.ok()) << applied.status().ToString();
  EXPECT_EQ(applied->entries, 8u);
  EXPECT_EQ(applied->data_bytes, 300000u + 10u);
  EXPECT_EQ(applied->deleted, 3u);  // the missing path is fine, and not counted

  EXPECT_EQ(*ReadFile(root + "/etc/app.conf"), "threads=8\n");
  EXPECT_EQ(*ReadFile(root + "/etc/keep"), "the image's own");
  EXPECT_EQ(*ReadFile(root + "/root/.cache/compiled/kernel.bin"), std::string(300000, 'k'));
  EXPECT_FALSE(Exists(root + "/etc/motd"));
  EXPECT_FALSE(Exists(root + "/var/cache/apt"));
  EXPECT_FALSE(Exists(root + "/var/cache/self"));
  EXPECT_EQ(*ReadFile(root + "/var/cache/debconf"), "d");
  EXPECT_FALSE(Exists(root + "/never"));
  struct stat a, b;
  ASSERT_EQ(::lstat((root + "/etc/app.hard").c_str(), &a), 0);
  ASSERT_EQ(::lstat((root + "/etc/app.conf").c_str(), &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);
  char target[32] = {};
  ASSERT_GT(::readlink((root + "/etc/app.link").c_str(), target, sizeof target - 1), 0);
  EXPECT_STREQ(target, "app.conf");
}

// A type change needs no deletion: the applier replaces what is there. A
// directory over a directory is kept, with what else it holds.
TEST(RootfsApplier, ReplacesADirectoryByAFileAndAFileByADirectory) {
  TempDir tmp{"rootfs-apply"};
  const std::string root = tmp.path() + "/root", tar = tmp.path() + "/rootfs-diff.tar";
  Write(root + "/a/x", "x");
  Write(root + "/a/y/z", "z");
  ASSERT_EQ(::symlink("/etc", (root + "/a/y/link").c_str()), 0);
  Write(root + "/b", "a file, soon a directory");
  Write(root + "/kept/old", "old");
  ASSERT_EQ(::chmod((root + "/kept").c_str(), 0700), 0);
  ASSERT_EQ(::symlink("/tmp", (root + "/l").c_str()), 0);  // a link, soon a file
  TarBuilder(tar).File("a", "a file now").Dir("b/").File("b/c", "c").Dir("kept/", 0751).File("kept/new", "new")
      .File("l", "no longer a link")
      .Close();
  auto applied = CheckAndApply(root, tar);
  ASSERT_TRUE(applied.ok()) << applied.status().ToString();
  EXPECT_EQ(*ReadFile(root + "/a"), "a file now");
  EXPECT_TRUE(IsDir(root + "/b"));
  EXPECT_EQ(*ReadFile(root + "/b/c"), "c");
  EXPECT_EQ(*ReadFile(root + "/kept/old"), "old");
  EXPECT_EQ(*ReadFile(root + "/kept/new"), "new");
  struct stat st;
  ASSERT_EQ(::lstat((root + "/kept").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0751u);
  EXPECT_EQ(st.st_mtim.tv_sec, 1700000000);
  ASSERT_EQ(::lstat((root + "/l").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
}

// The image's own link on the way (`opt -> /elsewhere`) is never written
// through, for an entry or a deletion: the apply stops naming both.
TEST(RootfsApplier, AnImageLinkOnTheWayIsRefusedAndNothingIsWrittenThroughIt) {
  TempDir tmp{"rootfs-apply"};
  const std::string root = tmp.path() + "/root", outside = tmp.path() + "/outside";
  Write(outside + "/victim", "the host's");
  ASSERT_TRUE(MakeDirs(root + "/usr").ok());
  ASSERT_EQ(::symlink(outside.c_str(), (root + "/opt").c_str()), 0);
  ASSERT_EQ(::symlink(outside.c_str(), (root + "/usr/lib").c_str()), 0);

  const std::string direct = tmp.path() + "/direct.tar";
  TarBuilder(direct).File("opt/x", "evil").Close();
  auto refused = CheckAndApply(root, direct);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("`opt/x`: its parent `opt` is a symbolic link (to `" + outside +
                                            "`) where the archive is applied; nothing is written through a link"),
            std::string::npos)
      << refused.status().message();

  const std::string deep = tmp.path() + "/deep.tar";
  TarBuilder(deep).Dir("usr/").File("usr/lib/python3/site.py", "evil").Close();
  refused = CheckAndApply(root, deep);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("`usr/lib/python3/site.py`: its parent `usr/lib` is a symbolic link"),
            std::string::npos)
      << refused.status().message();

  const std::string links = tmp.path() + "/links.tar";
  TarBuilder(links).File("a", "a").Hardlink("opt/hard", "a").Close();
  refused = CheckAndApply(root, links);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("`opt/hard`: its parent `opt` is a symbolic link"), std::string::npos)
      << refused.status().message();

  const std::string none = tmp.path() + "/none.tar";
  TarBuilder(none).File("fine", "f").Close();
  refused = CheckAndApply(root, none, {"/opt/victim"});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("deleting `/opt/victim`"), std::string::npos)
      << refused.status().message();

  auto listed = ListFilesRecursive(outside);
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(*listed, (std::vector<std::string>{"victim"}));
  EXPECT_EQ(*ReadFile(outside + "/victim"), "the host's");
}

// The plan is of archive A; what is applied is archive B, swapped in since.
TEST(RootfsApplier, AnArchiveChangedAfterTheCheckIsRefused) {
  TempDir tmp{"rootfs-apply"};
  const std::string root = tmp.path() + "/root", a = tmp.path() + "/a.tar";
  ASSERT_TRUE(MakeDirs(root).ok());
  TarBuilder(a).Dir("d/").File("d/one", "1").File("two", "2").Close();
  auto plan = CheckArchive(a, {}, "rootfs-diff.tar");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  UniqueFd fd = OpenPath(root);

  // Each into a root of its own: what the archive holds up to where it
  // differs is written, nothing from there on.
  auto refused_with = [&](const std::string& name, auto build) {
    const std::string b = tmp.path() + "/" + name, target = tmp.path() + "/root-" + name;
    TarBuilder builder(b);
    build(builder);
    builder.Close();
    EXPECT_TRUE(MakeDirs(target).ok());
    UniqueFd target_fd = OpenPath(target);
    auto applied = ApplyArchive(target_fd.get(), b, *plan);
    EXPECT_EQ(applied.status().code(), Code::kCorruption) << name << ": " << applied.status().ToString();
    EXPECT_NE(applied.status().message().find("the archive changed since it was checked"), std::string::npos)
        << applied.status().message();
    return applied.status().message();
  };
  std::string renamed =
      refused_with("renamed.tar", [](TarBuilder& t) { t.Dir("d/").File("d/one", "1").File("three", "3"); });
  EXPECT_NE(renamed.find("entry 3 is `three`, where the checked archive had `two`"), std::string::npos) << renamed;
  EXPECT_FALSE(Exists(tmp.path() + "/root-renamed.tar/three"));
  refused_with("longer.tar", [](TarBuilder& t) { t.Dir("d/").File("d/one", "1").File("two", "2").File("more", "m"); });
  EXPECT_FALSE(Exists(tmp.path() + "/root-longer.tar/more"));
  refused_with("shorter.tar", [](TarBuilder& t) { t.Dir("d/").File("d/one", "1"); });
  std::string relinked =
      refused_with("relinked.tar", [](TarBuilder& t) { t.Dir("d/").File("d/one", "1").Symlink("two", "/etc/shadow"); });
  EXPECT_NE(relinked.find("`two` (entry 3) is not the regular file it was"), std::string::npos) << relinked;
  EXPECT_FALSE(Exists(tmp.path() + "/root-relinked.tar/two"));
  refused_with("retyped.tar", [](TarBuilder& t) { t.Symlink("d", "/etc").File("d/one", "1").File("two", "2"); });
  auto nothing = ListFilesRecursive(tmp.path() + "/root-retyped.tar");
  ASSERT_TRUE(nothing.ok());
  EXPECT_TRUE(nothing->empty());
  refused_with("retargeted.tar", [](TarBuilder& t) { t.Dir("d/").File("d/one", "1").Hardlink("two", "d/one"); });

  // And A itself applies.
  auto applied = ApplyArchive(fd.get(), a, *plan);
  ASSERT_TRUE(applied.ok()) << applied.status().ToString();
  EXPECT_EQ(*ReadFile(root + "/two"), "2");
}

TEST(RootfsApplier, MalformedDeletedFilesAreRefused) {
  TempDir tmp{"rootfs-apply"};
  const std::string path = tmp.path() + "/deleted.files";
  for (const char* text : {"", "{}", "not json", "[\"/a\", 2]", "[\"/a\"", "\"/a\"", "[[\"/a\"]]"}) {
    ASSERT_TRUE(WriteFileAtomic(path, text).ok());
    auto read = ReadDeletedFiles(path);
    EXPECT_EQ(read.status().code(), Code::kCorruption) << text;
    EXPECT_NE(read.status().message().find(path), std::string::npos) << read.status().message();
  }
  ASSERT_TRUE(WriteFileAtomic(path, "[\n  \"/etc/motd\",\n  \"/var/cache/apt\"\n]").ok());
  auto read = ReadDeletedFiles(path);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, (std::vector<std::string>{"/etc/motd", "/var/cache/apt"}));
  ASSERT_TRUE(WriteFileAtomic(path, "[]").ok());
  EXPECT_TRUE(ReadDeletedFiles(path)->empty());
  EXPECT_EQ(ReadDeletedFiles(tmp.path() + "/missing").status().code(), Code::kNotFound);
}

// A flipped byte in a header, or an archive cut short, is refused by the
// check: nothing is applied from it.
TEST(RootfsApplier, ACorruptArchiveIsRefusedByTheCheck) {
  TempDir tmp{"rootfs-apply"};
  const std::string tar = tmp.path() + "/rootfs-diff.tar";
  TarBuilder(tar).Dir("etc/").File("etc/a", std::string(5000, 'a')).File("etc/b", std::string(5000, 'b')).Close();
  auto good = ReadFile(tar);
  ASSERT_TRUE(good.ok());
  ASSERT_TRUE(CheckArchive(tar, {}, "rootfs-diff.tar").ok());

  // The second entry's header: after the first header and no data (a directory).
  std::string flipped = *good;
  flipped[512 + 10] ^= 0x5a;
  ASSERT_TRUE(WriteFileAtomic(tar, flipped).ok());
  auto checked = CheckArchive(tar, {}, "rootfs-diff.tar");
  EXPECT_EQ(checked.status().code(), Code::kCorruption) << checked.status().ToString();
  EXPECT_NE(checked.status().message().find("checking `rootfs-diff.tar`"), std::string::npos)
      << checked.status().message();

  ASSERT_TRUE(WriteFileAtomic(tar, good->substr(0, 512 * 3 + 100)).ok());  // in etc/a's data
  checked = CheckArchive(tar, {}, "rootfs-diff.tar");
  EXPECT_EQ(checked.status().code(), Code::kCorruption) << checked.status().ToString();

  // An archive cut after the check is stopped where it ends, naming it.
  ASSERT_TRUE(WriteFileAtomic(tar, *good).ok());
  auto plan = CheckArchive(tar, {}, "rootfs-diff.tar");
  ASSERT_TRUE(plan.ok());
  ASSERT_TRUE(WriteFileAtomic(tar, good->substr(0, 512 * 3 + 100)).ok());
  const std::string root = tmp.path() + "/root";
  ASSERT_TRUE(MakeDirs(root).ok());
  UniqueFd fd = OpenPath(root);
  auto applied = ApplyArchive(fd.get(), tar, *plan);
  EXPECT_EQ(applied.status().code(), Code::kCorruption) << applied.status().ToString();
  EXPECT_NE(applied.status().message().find("`etc/a`"), std::string::npos) << applied.status().message();
}

// A plan that refused entries is never applied, even if the caller skipped
// the check.
TEST(RootfsApplier, ARefusingPlanIsNotApplied) {
  TempDir tmp{"rootfs-apply"};
  const std::string tar = tmp.path() + "/x.tar", root = tmp.path() + "/root";
  ASSERT_TRUE(MakeDirs(root).ok());
  TarBuilder(tar).Symlink("escape", "/etc").File("escape/evil", "x").Close();
  auto listed = ListArchive(tar);
  ASSERT_TRUE(listed.ok());
  ExtractionPlan plan = PlanExtraction(*listed);
  UniqueFd fd = OpenPath(root);
  EXPECT_EQ(ApplyArchive(fd.get(), tar, plan).status().code(), Code::kCorruption);
  EXPECT_FALSE(Exists(root + "/escape"));
}

class RootfsApplierMount : public ::testing::Test {
 protected:
  void TearDown() override {
    if (!mounted_.empty()) {
      EXPECT_EQ(::umount2(mounted_.c_str(), MNT_DETACH), 0) << std::strerror(errno);
    }
  }
  std::string mounted_;
};

// A volume of the new container is no part of its root: an entry in it, or a
// file over it, is refused naming it, and nothing is written into it. A
// directory at it (what a runtime made in the source to mount onto) is the
// volume's, left as it is.
TEST_F(RootfsApplierMount, AnEntryAcrossAMountPointIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: mounting a tmpfs in the target root";
  TempDir tmp{"rootfs-apply"};
  const std::string root = tmp.path() + "/root";
  ASSERT_TRUE(MakeDirs(root + "/data").ok());
  if (::mount("gpusnap-test", (root + "/data").c_str(), "tmpfs", 0, "size=1m") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  mounted_ = root + "/data";

  const std::string under = tmp.path() + "/under.tar";
  TarBuilder(under).File("data/cache/x", "x").Close();
  auto refused = CheckAndApply(root, under);
  EXPECT_EQ(refused.status().code(), Code::kFailedPrecondition) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("`data/cache/x`: its parent `data` is a mount point"), std::string::npos)
      << refused.status().message();

  const std::string at = tmp.path() + "/at.tar";
  TarBuilder(at).Dir("data/", 0700).Close();
  struct stat before{};
  ASSERT_EQ(::stat((root + "/data").c_str(), &before), 0);
  auto left = CheckAndApply(root, at);
  EXPECT_TRUE(left.ok()) << left.status().ToString();
  struct stat after{};
  ASSERT_EQ(::stat((root + "/data").c_str(), &after), 0);
  EXPECT_EQ(after.st_mode, before.st_mode) << "the volume's root keeps its own mode";

  const std::string over = tmp.path() + "/over.tar";
  TarBuilder(over).File("data", "a file over a volume").Close();
  refused = CheckAndApply(root, over);
  EXPECT_EQ(refused.status().code(), Code::kFailedPrecondition) << refused.status().ToString();

  const std::string none = tmp.path() + "/none.tar";
  TarBuilder(none).File("fine", "f").Close();
  refused = CheckAndApply(root, none, {"/data"});
  EXPECT_EQ(refused.status().code(), Code::kFailedPrecondition) << refused.status().ToString();

  auto listed = ListFilesRecursive(mounted_);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_TRUE(listed->empty());
  struct stat st;
  ASSERT_EQ(::stat(mounted_.c_str(), &st), 0);
  EXPECT_NE(st.st_mode & 07777, 0700u);  // the volume's own mode is untouched
}

}  // namespace
}  // namespace gpusnap::rootfs
