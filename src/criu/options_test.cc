#include "criu/options.h"

#include <gtest/gtest.h>

#include "criu/swrk.h"

namespace gpusnap::criu {
namespace {

DumpPlan BasicDump() {
  DumpPlan p;
  p.root_pid = 2;
  p.images_dir_fd = 7;
  p.work_dir_fd = 8;
  p.log_file = "dump.log";
  return p;
}

TEST(DumpOptions, CarriesTheTreeAndDirectories) {
  criu_opts o = DumpOptions(BasicDump(), Features{});
  EXPECT_EQ(o.pid(), 2);
  EXPECT_EQ(o.images_dir_fd(), 7);
  EXPECT_EQ(o.work_dir_fd(), 8);
  EXPECT_EQ(o.log_file(), "dump.log");
  EXPECT_FALSE(o.leave_running());
  EXPECT_FALSE(o.tcp_established());
  EXPECT_FALSE(o.shell_job());
}

TEST(DumpOptions, AlwaysAsksForNotificationsToPublishWhileFrozen) {
  EXPECT_TRUE(DumpOptions(BasicDump(), Features{}).notify_scripts());
}

TEST(DumpOptions, LeaveRunningIsPassedThrough) {
  DumpPlan p = BasicDump();
  p.leave_running = true;
  EXPECT_TRUE(DumpOptions(p, Features{}).leave_running());
}

TEST(DumpOptions, LogLevelIsQuietUnlessVerbose) {
  DumpPlan p = BasicDump();
  EXPECT_EQ(DumpOptions(p, Features{}).log_level(), 2);
  p.verbose = true;
  EXPECT_EQ(DumpOptions(p, Features{}).log_level(), 4);
}

TEST(DumpOptions, DeletedFilesUpTo256MiBAreKept) {
  EXPECT_EQ(DumpOptions(BasicDump(), Features{}).ghost_limit(), 256u << 20);
}

TEST(DumpOptions, TcpEstablishedUsesNftablesWhenCriuHasIt) {
  DumpPlan p = BasicDump();
  p.tcp_established = true;
  Features with_nft;
  with_nft.nftables = true;
  criu_opts o = DumpOptions(p, with_nft);
  EXPECT_TRUE(o.tcp_established());
  EXPECT_EQ(o.network_lock(), NFTABLES);
  criu_opts without = DumpOptions(p, Features{});
  EXPECT_TRUE(without.tcp_established());
  EXPECT_FALSE(without.has_network_lock());
}

TEST(DumpOptions, NoNetworkLockChoiceWithoutTcp) {
  Features with_nft;
  with_nft.nftables = true;
  EXPECT_FALSE(DumpOptions(BasicDump(), with_nft).has_network_lock());
}

TEST(DumpOptions, ShellJobWhenTheSessionIsOutside) {
  DumpPlan p = BasicDump();
  p.shell_job = true;
  EXPECT_TRUE(DumpOptions(p, Features{}).shell_job());
}

RestorePlan SomeRestorePlan() {
  RestorePlan p;
  p.images_dir_fd = 3;
  p.work_dir_fd = 4;
  return p;
}

TEST(RestoreOptions, MirrorsTheDumpsTcpAndShellChoices) {
  RestorePlan p = SomeRestorePlan();
  p.log_file = "restore.log";
  p.tcp_established = true;
  p.shell_job = true;
  criu_opts o = RestoreOptions(p, Features{});
  EXPECT_TRUE(o.tcp_established());
  EXPECT_TRUE(o.shell_job());
  EXPECT_FALSE(o.has_pid());
  EXPECT_EQ(o.images_dir_fd(), 3);
  EXPECT_EQ(o.log_file(), "restore.log");
  EXPECT_TRUE(o.notify_scripts());
}

TEST(RestoreOptions, IntoAContainerTheTreeKeepsCriusCgroups) {
  RestorePlan p = SomeRestorePlan();
  EXPECT_FALSE(RestoreOptions(p, Features{}).has_manage_cgroups_mode());
  p.keep_criu_cgroups = true;
  criu_opts o = RestoreOptions(p, Features{});
  EXPECT_TRUE(o.manage_cgroups());
  EXPECT_EQ(o.manage_cgroups_mode(), IGNORE);
}

TEST(RestoreOptions, LeftStoppedOnlyWhenAsked) {
  RestorePlan p = SomeRestorePlan();
  EXPECT_FALSE(RestoreOptions(p, Features{}).has_leave_stopped());
  p.leave_stopped = true;
  EXPECT_TRUE(RestoreOptions(p, Features{}).leave_stopped());
}

TEST(RestoreOptions, LazyPagesOnlyWhenAsked) {
  RestorePlan p = SomeRestorePlan();
  EXPECT_FALSE(RestoreOptions(p, Features{}).has_lazy_pages());
  p.lazy_pages = true;
  criu_opts o = RestoreOptions(p, Features{});
  EXPECT_TRUE(o.lazy_pages());
  // The daemon is found through the work dir; the restore names no page server.
  EXPECT_EQ(o.work_dir_fd(), 4);
  EXPECT_FALSE(o.has_ps());
}

TEST(ErrorLines, KeepsTheLastErrorLinesOnly) {
  std::string log =
      "(00.001) Warn: something\n"
      "(00.002) Error (criu/a.c:1): first\n"
      "(00.003) info\n"
      "(00.004) Error (criu/b.c:2): second\n"
      "(00.005) Error (criu/c.c:3): third\n";
  EXPECT_EQ(ErrorLines(log, 2), "(00.004) Error (criu/b.c:2): second\n(00.005) Error (criu/c.c:3): third");
  EXPECT_EQ(ErrorLines("all fine\n"), "");
}

}  // namespace
}  // namespace gpusnap::criu
