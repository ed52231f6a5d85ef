#include "snapshot/privilege.h"

#include <linux/capability.h>

#include <gtest/gtest.h>

namespace gpusnap {
namespace {

using proc::Credentials;
using proc::SeccompMode;

constexpr uint64_t Cap(int cap) { return 1ull << cap; }

// A process as a runtime starts one: every id `id`, `caps` in every set but
// inheritable and ambient.
Credentials Started(uint32_t id, uint64_t caps, bool no_new_privs = false) {
  Credentials c;
  c.uid = c.euid = c.suid = c.fsuid = id;
  c.gid = c.egid = c.sgid = c.fsgid = id;
  c.cap_permitted = c.cap_effective = c.cap_bounding = caps;
  c.no_new_privs = no_new_privs;
  return c;
}

std::string Joined(const std::vector<std::string>& findings) {
  std::string out;
  for (const auto& f : findings) out += f + "|";
  return out;
}

TEST(PrivilegeBeyond, NothingBeyondAnEqualOrALesserTask) {
  Credentials init = Started(0, Cap(CAP_KILL) | Cap(CAP_SYS_ADMIN), true);
  EXPECT_TRUE(PrivilegeBeyond(init, init).empty());
  Credentials lesser = Started(0, Cap(CAP_KILL), true);
  lesser.cap_effective = 0;
  EXPECT_TRUE(PrivilegeBeyond(lesser, init).empty());
}

TEST(PrivilegeBeyond, ARootTaskBeyondAnUnprivilegedInit) {
  auto findings = PrivilegeBeyond(Started(0, Cap(CAP_KILL) | Cap(CAP_SYS_ADMIN), true), Started(1000, 0, true));
  ASSERT_EQ(findings.size(), 3u) << Joined(findings);
  EXPECT_EQ(findings[0], "runs as uid 0 (the placeholder's init: uid 1000, without CAP_SETUID)");
  EXPECT_EQ(findings[1], "runs as gid 0 (the placeholder's init: gid 1000, without CAP_SETGID)");
  EXPECT_EQ(findings[2], "holds CAP_KILL, CAP_SYS_ADMIN in its permitted, effective and bounding sets, which the "
                         "placeholder's init does not");
}

TEST(PrivilegeBeyond, EachIdOfATaskCountsNotOnlyItsRealOne) {
  Credentials init = Started(1000, 0);
  Credentials task = init;
  task.suid = 0;  // a saved set-user-id of root: it can become root again
  EXPECT_EQ(Joined(PrivilegeBeyond(task, init)),
            "runs as uid 0 (the placeholder's init: uid 1000, without CAP_SETUID)|");
  task = init;
  task.fsgid = 42;
  EXPECT_EQ(Joined(PrivilegeBeyond(task, init)),
            "runs as gid 42 (the placeholder's init: gid 1000, without CAP_SETGID)|");
  // Another of the init's own ids is no gain.
  init.suid = 0;
  task = Started(1000, 0);
  task.euid = 0;
  EXPECT_TRUE(PrivilegeBeyond(task, init).empty());
}

TEST(PrivilegeBeyond, CapSetuidAndCapSetgidLetAnyIdBe) {
  Credentials init = Started(1000, Cap(CAP_SETUID) | Cap(CAP_SETGID));
  Credentials task = Started(0, 0);
  task.groups = {27};
  EXPECT_TRUE(PrivilegeBeyond(task, init).empty());
  init = Started(1000, Cap(CAP_SETUID));
  EXPECT_EQ(Joined(PrivilegeBeyond(task, init)),
            "runs as gid 0 (the placeholder's init: gid 1000, without CAP_SETGID)|is in group 27, which the "
            "placeholder's init is not (nor holds CAP_SETGID)|");
}

TEST(PrivilegeBeyond, SupplementaryGroupsAmongTheInitsGroupsAndGids) {
  Credentials init = Started(1000, 0);
  init.groups = {4, 27};
  Credentials task = Started(1000, 0);
  task.groups = {27, 1000};  // one of the init's groups, and its own gid
  EXPECT_TRUE(PrivilegeBeyond(task, init).empty());
  task.groups = {0, 4, 6};
  EXPECT_EQ(Joined(PrivilegeBeyond(task, init)),
            "is in group 0, 6, which the placeholder's init is not (nor holds CAP_SETGID)|");
}

TEST(PrivilegeBeyond, EachCapabilitySetHasItsBound) {
  Credentials init = Started(0, Cap(CAP_KILL) | Cap(CAP_NET_BIND_SERVICE));
  init.cap_effective = Cap(CAP_KILL);  // effective may be raised within permitted: no bound of its own
  Credentials task = init;
  task.cap_effective = Cap(CAP_KILL) | Cap(CAP_NET_BIND_SERVICE);
  EXPECT_TRUE(PrivilegeBeyond(task, init).empty());

  task = init;
  task.cap_bounding |= Cap(CAP_SYS_PTRACE);
  EXPECT_EQ(Joined(PrivilegeBeyond(task, init)),
            "holds CAP_SYS_PTRACE in its bounding set, which the placeholder's init does not|");

  // Inheritable: what the init could make so, its inheritable and permitted sets.
  task = init;
  task.cap_inheritable = Cap(CAP_KILL);
  EXPECT_TRUE(PrivilegeBeyond(task, init).empty());
  task.cap_inheritable = Cap(CAP_NET_RAW);
  EXPECT_EQ(Joined(PrivilegeBeyond(task, init)),
            "holds CAP_NET_RAW in its inheritable set, which the placeholder's init does not|");
  // ... and its bounding set too with CAP_SETPCAP.
  Credentials setpcap = Started(0, Cap(CAP_SETPCAP));
  setpcap.cap_bounding |= Cap(CAP_NET_RAW);
  Credentials inheriting = Started(0, 0);
  inheriting.cap_inheritable = Cap(CAP_NET_RAW);
  EXPECT_TRUE(PrivilegeBeyond(inheriting, setpcap).empty());
  Credentials without = setpcap;
  without.cap_permitted = without.cap_effective = 0;
  EXPECT_EQ(Joined(PrivilegeBeyond(inheriting, without)),
            "holds CAP_NET_RAW in its inheritable set, which the placeholder's init does not|");

  // Ambient: within what the init holds and could make inheritable.
  task = init;
  task.cap_inheritable = task.cap_ambient = Cap(CAP_KILL);
  EXPECT_TRUE(PrivilegeBeyond(task, init).empty());
  task.cap_ambient = Cap(CAP_SYS_ADMIN);
  EXPECT_EQ(Joined(PrivilegeBeyond(task, init)),
            "holds CAP_SYS_ADMIN in its ambient set, which the placeholder's init does not|");

  // A task's capabilities above the 32nd are named too.
  task = init;
  task.cap_permitted |= Cap(CAP_CHECKPOINT_RESTORE);
  EXPECT_EQ(Joined(PrivilegeBeyond(task, init)),
            "holds CAP_CHECKPOINT_RESTORE in its permitted set, which the placeholder's init does not|");
}

TEST(PrivilegeBeyond, NoNewPrivsOfTheInitBindsTheTask) {
  Credentials init = Started(1000, 0, true);
  EXPECT_EQ(Joined(PrivilegeBeyond(Started(1000, 0, false), init)),
            "runs without no_new_privs, which the placeholder's init has|");
  EXPECT_TRUE(PrivilegeBeyond(Started(1000, 0, true), Started(1000, 0, false)).empty());
}

TEST(PrivilegeBeyond, EverySeccompFilterOfTheInitMustBindTheTask) {
  const std::string profile(16, 'p'), other(8, 'o'), own(24, 'w');
  Credentials init = Started(1000, 0, true);
  init.seccomp_mode = SeccompMode::kFilter;
  init.seccomp_filters = {profile};
  Credentials task = Started(1000, 0, true);
  EXPECT_EQ(Joined(PrivilegeBeyond(task, init)), "runs without seccomp, whose filters bind the placeholder's init|");
  task.seccomp_mode = SeccompMode::kFilter;
  task.seccomp_filters = {other};
  EXPECT_EQ(Joined(PrivilegeBeyond(task, init)),
            "is not bound by 1 of the 1 seccomp filter(s) that bind the placeholder's init|");
  // The init's filter among its own, in any place: more filters only narrow it.
  task.seccomp_filters = {own, profile, other};
  EXPECT_TRUE(PrivilegeBeyond(task, init).empty());
  // Strict mode allows less than any filter.
  task.seccomp_mode = SeccompMode::kStrict;
  task.seccomp_filters.clear();
  EXPECT_TRUE(PrivilegeBeyond(task, init).empty());
  // A strict init binds the task to strict mode.
  init.seccomp_mode = SeccompMode::kStrict;
  task.seccomp_mode = SeccompMode::kFilter;
  EXPECT_EQ(Joined(PrivilegeBeyond(task, init)),
            "runs outside seccomp strict mode, which binds the placeholder's init|");
  // An unfiltered init binds nothing.
  EXPECT_TRUE(PrivilegeBeyond(task, Started(1000, 0, true)).empty());
}

TEST(CheckWithinPlaceholder, OKWhenEveryThreadFits) {
  Credentials init = Started(0, Cap(CAP_KILL));
  EXPECT_TRUE(CheckWithinPlaceholder("lead", "in the snapshot",
                                     {{.pid = 1, .tid = 1, .comm = "sh", .creds = init},
                                      {.pid = 7, .tid = 7, .comm = "cnt:3", .creds = Started(0, 0)}},
                                     init)
                  .ok());
}

TEST(CheckWithinPlaceholder, OneLineNamingEachProcessAndWhatItHolds) {
  Credentials init = Started(1000, 0, true);
  Credentials root = Started(0, Cap(CAP_SYS_ADMIN), true);
  Credentials thread_with_more = Started(1000, Cap(CAP_KILL), true);
  Status st = CheckWithinPlaceholder("snapshot `s` needs more privilege than placeholder container `c` holds",
                                     "in the snapshot",
                                     {{.pid = 1, .tid = 1, .comm = "sh", .creds = Started(1000, 0, true)},
                                      {.pid = 7, .tid = 7, .comm = "server", .creds = root},
                                      {.pid = 7, .tid = 8, .comm = "worker", .creds = root},  // as its process: unsaid
                                      {.pid = 9, .tid = 9, .comm = "cnt:4", .creds = Started(1000, 0, true)},
                                      {.pid = 9, .tid = 10, .comm = "helper", .creds = thread_with_more}},
                                     init);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Code::kFailedPrecondition);
  EXPECT_EQ(st.message(),
            "snapshot `s` needs more privilege than placeholder container `c` holds: pid 7 (server) in the snapshot "
            "runs as uid 0 (the placeholder's init: uid 1000, without CAP_SETUID), runs as gid 0 (the "
            "placeholder's init: gid 1000, without CAP_SETGID) and holds CAP_SYS_ADMIN in its permitted, effective "
            "and bounding sets, which the placeholder's init does not; thread 10 of pid 9 (helper) in the snapshot "
            "holds CAP_KILL in its permitted, effective and bounding sets, which the placeholder's init does not");
  EXPECT_EQ(st.message().find('\n'), std::string::npos);
}

TEST(CheckWithinPlaceholder, ThreadsThatHoldTheSameAreToldTogetherThreeByName) {
  Credentials init = Started(1000, 0);
  std::vector<CheckedThread> threads;
  for (pid_t pid = 1; pid <= 5; ++pid)
    threads.push_back({.pid = pid, .tid = pid, .comm = "p", .creds = Started(0, 0)});
  threads.push_back({.pid = 6, .tid = 6, .comm = "q", .creds = Started(1000, Cap(CAP_KILL))});
  Status st = CheckWithinPlaceholder("lead", "as restored", threads, init);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(),
            "lead: pid 1 (p), pid 2 (p), pid 3 (p) and 2 more as restored: each runs as uid 0 (the placeholder's "
            "init: uid 1000, without CAP_SETUID) and runs as gid 0 (the placeholder's init: gid 1000, without "
            "CAP_SETGID); pid 6 (q) as restored holds CAP_KILL in its permitted, effective and bounding sets, which "
            "the placeholder's init does not");
}

}  // namespace
}  // namespace gpusnap
