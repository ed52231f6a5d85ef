#include "proc/credentials.h"

#include <unistd.h>

#include <gtest/gtest.h>

namespace gpusnap::proc {
namespace {

TEST(StatusCredentials, EveryIdSetAndFlagAsTheKernelWritesThem) {
  auto c = ParseStatusCredentials("Name:\tsh\nUid:\t1000\t1001\t1002\t1003\nGid:\t100\t101\t102\t103\n"
                                  "Groups:\t4 27 100 \nCapInh:\t0000000000000000\nCapPrm:\t00000000a80425fb\n"
                                  "CapEff:\t00000000a80405fb\nCapBnd:\t000001ffffffffff\nCapAmb:\t0000000000000400\n"
                                  "NoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t3\n",
                                  "/proc/7/status");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->uid, 1000u);
  EXPECT_EQ(c->euid, 1001u);
  EXPECT_EQ(c->suid, 1002u);
  EXPECT_EQ(c->fsuid, 1003u);
  EXPECT_EQ(c->gid, 100u);
  EXPECT_EQ(c->egid, 101u);
  EXPECT_EQ(c->sgid, 102u);
  EXPECT_EQ(c->fsgid, 103u);
  EXPECT_EQ(c->groups, (std::vector<gid_t>{4, 27, 100}));
  EXPECT_EQ(c->cap_inheritable, 0u);
  EXPECT_EQ(c->cap_permitted, 0xa80425fbull);
  EXPECT_EQ(c->cap_effective, 0xa80405fbull);
  EXPECT_EQ(c->cap_bounding, 0x1ffffffffffull);
  EXPECT_EQ(c->cap_ambient, 0x400ull);
  EXPECT_TRUE(c->no_new_privs);
  EXPECT_EQ(c->seccomp_mode, SeccompMode::kFilter);
  EXPECT_TRUE(c->seccomp_filters.empty());  // not in /proc/<pid>/status
}

TEST(StatusCredentials, NoGroupsNoFlags) {
  auto c = ParseStatusCredentials("Uid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\t\nCapBnd:\t000001ffffffffff\n"
                                  "NoNewPrivs:\t0\nSeccomp:\t0\n",
                                  "x");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->groups.empty());
  EXPECT_FALSE(c->no_new_privs);
  EXPECT_EQ(c->seccomp_mode, SeccompMode::kDisabled);
}

TEST(StatusCredentials, AStatusWithoutThemIsRefusedNamingIt) {
  auto c = ParseStatusCredentials("Name:\tsh\nUid:\t0\t0\t0\t0\n", "/proc/7/status");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("/proc/7/status"), std::string::npos);
}

TEST(StatusCredentials, OurOwnAsTheKernelReportsThem) {
  auto c = ReadTaskCredentials(::getpid(), ::getpid());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->uid, ::getuid());
  EXPECT_EQ(c->euid, ::geteuid());
  EXPECT_EQ(c->gid, ::getgid());
  EXPECT_FALSE(ReadTaskCredentials(::getpid(), 0).ok());
}

}  // namespace
}  // namespace gpusnap::proc
