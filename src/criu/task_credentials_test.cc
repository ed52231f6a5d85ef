#include "criu/task_credentials.h"

#include <gtest/gtest.h>

#include "criu/images_testing.h"
#include "util/files.h"
#include "util/temp_dir_testing.h"

namespace gpusnap::criu {
namespace {

using namespace testing;  // NOLINT: the image spellers

class TaskCredentialsTest : public ::testing::Test {
 protected:
  TempDir tmp_{"task-creds"};
  void Write(const std::string& name, const std::string& bytes) {
    ASSERT_TRUE(WriteFileSynced(tmp_.path() + "/" + name, bytes).ok()) << name;
  }
};

// Two BPF programs of one and two instructions (struct sock_filter: 8 bytes each).
const std::string kAllow = std::string("\x06\x00\x00\x00\x00\x00\xff\x7f", 8);
const std::string kDenyKeyctl = std::string(16, '\x15');

TEST_F(TaskCredentialsTest, EveryFieldOfEveryThreadAsRecorded) {
  Write("pstree.img", Image(kPstreeMagic, {Process(1, {1}), Process(7, {7, 8})}));
  CredsFields root;
  root.prm = root.eff = 0x200020;
  root.bnd = 0x1ffffffffff;
  root.no_new_privs = 1;
  Write("core-1.img", Image(kCoreMagic, {Core(Creds(root), "sh")}));
  CredsFields f;
  f.uid = 1000, f.gid = 100, f.euid = 1001, f.egid = 101, f.suid = 1002, f.sgid = 102, f.fsuid = 1003;
  f.fsgid = 103, f.inh = 1ull << 33, f.prm = 1ull << 40, f.eff = 1, f.bnd = 1ull << 40 | 1, f.amb = 1ull << 40;
  f.groups = {4, 27};
  Write("core-7.img", Image(kCoreMagic, {Core(Creds(f), "server")}));
  CredsFields worker_fields;
  worker_fields.uid = 1000;
  worker_fields.groups = {4};
  worker_fields.packed = true;
  Write("core-8.img", Image(kCoreMagic, {Core(Creds(worker_fields), "worker")}));
  auto threads = ReadDumpedCredentials(tmp_.path());
  ASSERT_TRUE(threads.ok()) << threads.status().ToString();
  ASSERT_EQ(threads->size(), 3u);
  const auto& sh = (*threads)[0];
  EXPECT_EQ(sh.pid, 1);
  EXPECT_EQ(sh.tid, 1);
  EXPECT_EQ(sh.comm, "sh");
  EXPECT_EQ(sh.creds.cap_permitted, 0x200020u);
  EXPECT_EQ(sh.creds.cap_bounding, 0x1ffffffffffu);
  EXPECT_TRUE(sh.creds.no_new_privs);
  EXPECT_EQ(sh.creds.seccomp_mode, proc::SeccompMode::kDisabled);
  const auto& server = (*threads)[1];
  EXPECT_EQ(server.pid, 7);
  EXPECT_EQ(server.tid, 7);
  EXPECT_EQ(server.creds.uid, 1000u);
  EXPECT_EQ(server.creds.euid, 1001u);
  EXPECT_EQ(server.creds.suid, 1002u);
  EXPECT_EQ(server.creds.fsuid, 1003u);
  EXPECT_EQ(server.creds.gid, 100u);
  EXPECT_EQ(server.creds.egid, 101u);
  EXPECT_EQ(server.creds.sgid, 102u);
  EXPECT_EQ(server.creds.fsgid, 103u);
  EXPECT_EQ(server.creds.groups, (std::vector<gid_t>{4, 27}));
  EXPECT_EQ(server.creds.cap_inheritable, 1ull << 33);  // the high word
  EXPECT_EQ(server.creds.cap_permitted, 1ull << 40);
  EXPECT_EQ(server.creds.cap_effective, 1u);
  EXPECT_EQ(server.creds.cap_ambient, 1ull << 40);
  EXPECT_FALSE(server.creds.no_new_privs);
  const auto& worker = (*threads)[2];  // a thread of pid 7, its arrays packed
  EXPECT_EQ(worker.pid, 7);
  EXPECT_EQ(worker.tid, 8);
  EXPECT_EQ(worker.comm, "worker");
  EXPECT_EQ(worker.creds.groups, (std::vector<gid_t>{4}));
}

TEST_F(TaskCredentialsTest, SeccompChainsFromTheImageAndTsyncReachesEveryThread) {
  Write("pstree.img", Image(kPstreeMagic, {Process(1, {1, 2}), Process(3, {3, 4})}));
  // Filters 0 (oldest) and 1 of pid 1, synced to all its threads; filter 2 of thread 4 alone.
  Write("seccomp.img", Image(kSeccompMagic, {SeccompFilters({SeccompFilter(kAllow, {}, 1),
                                                             SeccompFilter(kDenyKeyctl, 0, 1),
                                                             SeccompFilter(kDenyKeyctl, {}, 0)})}));
  Write("core-1.img", Image(kCoreMagic, {Core(Creds(CredsFields()), "a", 2, 1)}));
  Write("core-2.img", Image(kCoreMagic, {Core(Creds(CredsFields()), "a")}));  // no mode: takes the synced chain
  Write("core-3.img", Image(kCoreMagic, {Core(Creds(CredsFields()), "b")}));
  Write("core-4.img", Image(kCoreMagic, {Core(Creds(CredsFields()), "b", 2, 2)}));
  auto threads = ReadDumpedCredentials(tmp_.path());
  ASSERT_TRUE(threads.ok()) << threads.status().ToString();
  ASSERT_EQ(threads->size(), 4u);
  EXPECT_EQ((*threads)[0].creds.seccomp_mode, proc::SeccompMode::kFilter);
  EXPECT_EQ((*threads)[0].creds.seccomp_filters, (std::vector<std::string>{kDenyKeyctl, kAllow}));  // newest first
  EXPECT_EQ((*threads)[1].creds.seccomp_mode, proc::SeccompMode::kFilter);
  EXPECT_EQ((*threads)[1].creds.seccomp_filters, (*threads)[0].creds.seccomp_filters);
  EXPECT_EQ((*threads)[2].creds.seccomp_mode, proc::SeccompMode::kDisabled);  // not synced: its own
  EXPECT_EQ((*threads)[3].creds.seccomp_filters, (std::vector<std::string>{kDenyKeyctl}));
}

TEST_F(TaskCredentialsTest, OlderDumpsKeepTheSeccompFieldsPerProcess) {
  Write("pstree.img", Image(kPstreeMagic, {Process(1, {1})}));
  Write("seccomp.img", Image(kSeccompMagic, {SeccompFilters({SeccompFilter(kAllow, {}, 0)})}));
  Write("core-1.img", Image(kCoreMagic, {Core(Creds(CredsFields()), "a", 2, 0, 1, /*old_seccomp=*/true)}));
  auto threads = ReadDumpedCredentials(tmp_.path());
  ASSERT_TRUE(threads.ok()) << threads.status().ToString();
  EXPECT_EQ((*threads)[0].creds.seccomp_filters, (std::vector<std::string>{kAllow}));
}

TEST_F(TaskCredentialsTest, AZombieRunsNothingAndIsLeftOut) {
  Write("pstree.img", Image(kPstreeMagic, {Process(1, {1}), Process(5, {})}));
  Write("core-1.img", Image(kCoreMagic, {Core(Creds(CredsFields()), "sh")}));
  Write("core-5.img", Image(kCoreMagic, {Core("", "defunct", {}, {}, 2)}));
  auto threads = ReadDumpedCredentials(tmp_.path());
  ASSERT_TRUE(threads.ok()) << threads.status().ToString();
  ASSERT_EQ(threads->size(), 1u);
  EXPECT_EQ((*threads)[0].pid, 1);
}

TEST_F(TaskCredentialsTest, WhatIsNotAsCriuWritesItIsNamed) {
  Write("pstree.img", Image(kPstreeMagic, {Process(1, {1})}));
  auto missing = ReadDumpedCredentials(tmp_.path());
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("core-1.img"), std::string::npos) << missing.status().message();

  Write("core-1.img", Image(kCoreMagic, {VarintField(1, 1)}));  // no thread_core: no credentials
  auto no_creds = ReadDumpedCredentials(tmp_.path());
  EXPECT_EQ(no_creds.status().code(), Code::kCorruption);
  EXPECT_NE(no_creds.status().message().find("core-1.img`: it holds no credentials"), std::string::npos)
      << no_creds.status().message();

  Write("core-1.img", Image(kCoreMagic, {Core(Creds(CredsFields()), "a", 2, 5)}));  // filter 5 of none
  auto out_of_range = ReadDumpedCredentials(tmp_.path());
  EXPECT_EQ(out_of_range.status().code(), Code::kCorruption);
  EXPECT_NE(out_of_range.status().message().find("seccomp filter index 5"), std::string::npos)
      << out_of_range.status().message();

  Write("seccomp.img", Image(kSeccompMagic, {SeccompFilters({SeccompFilter(kAllow, 0, 0)})}));  // a loop
  Write("core-1.img", Image(kCoreMagic, {Core(Creds(CredsFields()), "a", 2, 0)}));
  auto loop = ReadDumpedCredentials(tmp_.path());
  EXPECT_EQ(loop.status().code(), Code::kCorruption) << loop.status().ToString();

  Write("seccomp.img", Image(kSeccompMagic, {SeccompFilters({SeccompFilter("odd", {}, 0)})}));
  auto not_bpf = ReadDumpedCredentials(tmp_.path());
  EXPECT_EQ(not_bpf.status().code(), Code::kCorruption);

  Write("pstree.img", Image(kCoreMagic, {Process(1, {1})}));
  auto wrong_magic = ReadDumpedCredentials(tmp_.path());
  EXPECT_NE(wrong_magic.status().message().find("pstree.img` has magic"), std::string::npos)
      << wrong_magic.status().message();
}

}  // namespace
}  // namespace gpusnap::criu
