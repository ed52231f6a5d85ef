#include "criu/operation.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "util/files.h"
#include "util/temp_dir_testing.h"

namespace gpusnap::criu {
namespace {

constexpr std::chrono::seconds kTimeout{600};

criu_resp Answer(bool success, int cr_errno = 0) {
  criu_resp r;
  r.set_type(DUMP);
  r.set_success(success);
  if (cr_errno != 0) r.set_cr_errno(cr_errno);
  return r;
}

// The wait status of a real child that ran `body` (and _exit(0) after it).
template <typename Body>
int WaitStatusOf(Body body) {
  pid_t p = ::fork();
  if (p == 0) {
    body();
    _exit(0);
  }
  int wstatus = 0;
  ::waitpid(p, &wstatus, 0);
  return wstatus;
}

TEST(CriuExitFromLauncher, ReadsCriusExitCodeAndTheSignalAsTheLauncherPassesThem) {
  CriuExit three = CriuExitFromLauncher(WaitStatusOf([] { _exit(3); }));
  EXPECT_EQ(three.code, 3);
  EXPECT_EQ(three.signal, 0);
  // The launcher reports a CRIU killed by SIGSEGV as 128 + 11.
  CriuExit segv = CriuExitFromLauncher(WaitStatusOf([] { _exit(128 + SIGSEGV); }));
  EXPECT_EQ(segv.signal, SIGSEGV);
  // CRIU's own -1 is status 255, no signal.
  CriuExit minus_one = CriuExitFromLauncher(WaitStatusOf([] { _exit(255); }));
  EXPECT_EQ(minus_one.code, 255);
  EXPECT_EQ(minus_one.signal, 0);
  // A launcher killed itself.
  CriuExit killed = CriuExitFromLauncher(WaitStatusOf([] { ::raise(SIGKILL); }));
  EXPECT_EQ(killed.signal, SIGKILL);
}

TEST(DescribeExit, NamesTheStatusOrTheSignal) {
  EXPECT_EQ(DescribeExit({.code = 2, .signal = 0}), "exited with status 2");
  EXPECT_EQ(DescribeExit({.code = 0, .signal = SIGKILL}), "was killed by signal 9 (SIGKILL)");
}

TEST(Verdict, SuccessNeedsTheAnswerAndAnExitOfZero) {
  EXPECT_TRUE(Verdict(DUMP, Answer(true), CriuExit{.code = 0, .signal = 0}, kTimeout).ok());
}

TEST(Verdict, SuccessFollowedByANonZeroExitIsAFailureSayingSo) {
  Status st = Verdict(RESTORE, Answer(true), CriuExit{.code = 1, .signal = 0}, kTimeout);
  EXPECT_EQ(st.code(), Code::kExternal);
  EXPECT_EQ(st.message(), "CRIU restore failed: it answered success, then CRIU exited with status 1");
}

TEST(Verdict, SuccessFollowedByDeathBySignalIsAFailureNamingTheSignal) {
  Status st = Verdict(DUMP, Answer(true), CriuExit{.code = 0, .signal = SIGSEGV}, kTimeout);
  EXPECT_EQ(st.code(), Code::kExternal);
  EXPECT_EQ(st.message(), "CRIU dump failed: it answered success, then CRIU was killed by signal 11 (SIGSEGV)");
}

TEST(Verdict, SuccessWithoutAnExitBeforeTheDeadlineIsATimeout) {
  Status st = Verdict(DUMP, Answer(true), std::nullopt, kTimeout);
  EXPECT_EQ(st.code(), Code::kTimeout);
  EXPECT_NE(st.message().find("did not exit in time"), std::string::npos) << st.message();
}

TEST(Verdict, AFailedAnswerEndingWithStatusOneSaysOnlyWhy) {
  Status st = Verdict(DUMP, Answer(false, EPERM), CriuExit{.code = 1, .signal = 0}, kTimeout);
  EXPECT_EQ(st.code(), Code::kExternal);
  EXPECT_EQ(st.message(), "CRIU dump failed: " + Status::ErrnoText(EPERM));
}

TEST(Verdict, AFailedAnswerEndingOtherwiseTellsTheEnding) {
  Status st = Verdict(DUMP, Answer(false), CriuExit{.code = 0, .signal = SIGABRT}, kTimeout);
  EXPECT_EQ(st.message(), "CRIU dump failed; CRIU was killed by signal 6 (SIGABRT)");
}

TEST(Verdict, NoAnswerTellsWhyAndTheEnding) {
  Result<criu_resp> none = Status::Error(Code::kExternal, "CRIU exited without answering");
  Status st = Verdict(RESTORE, none, CriuExit{.code = 0, .signal = SIGSEGV}, kTimeout);
  EXPECT_EQ(st.code(), Code::kExternal);
  EXPECT_EQ(st.message(), "CRIU restore failed: CRIU exited without answering; CRIU was killed by signal 11 (SIGSEGV)");
}

TEST(Verdict, ADeadlinePassedIsATimeoutNamingIt) {
  Result<criu_resp> none = Status::Error(Code::kTimeout, "CRIU did not answer before the deadline; it was stopped");
  Status st = Verdict(DUMP, none, std::nullopt, std::chrono::seconds(5));
  EXPECT_EQ(st.code(), Code::kTimeout);
  EXPECT_EQ(st.message(), "CRIU dump did not finish within 5 s; it was stopped");
}

class ConfigFileTest : public ::testing::Test {
 protected:
  TempDir tmp_{"criu-config-test"};
  void SetUp() override {
    dir_ = tmp_.path();
  }
  std::string dir_;
};

TEST_F(ConfigFileTest, ReadableAbsoluteFileIsTaken) {
  std::string path = dir_ + "/criu.conf";
  ASSERT_TRUE(WriteFileSynced(path, "leave-running\n").ok());
  EXPECT_TRUE(CheckConfigFile(path).ok());
}

TEST_F(ConfigFileTest, MissingFileIsRefusedNamingIt) {
  std::string path = dir_ + "/no-such.conf";
  Status st = CheckConfigFile(path);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "CRIU configuration file `" + path + "`: No such file or directory");
}

TEST_F(ConfigFileTest, RelativePathIsRefused) {
  // CRIU would look for it from its own working directory, /.
  Status st = CheckConfigFile("criu.conf");
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "CRIU configuration file `criu.conf` is not an absolute path");
}

TEST_F(ConfigFileTest, RunRefusesItBeforeStartingCriu) {
  // A bundle that cannot start anything: the refusal comes first.
  Bundle none{dir_, dir_ + "/no-loader", dir_ + "/no-criu", ""};
  criu_opts opts;
  opts.set_config_file(dir_ + "/no-such.conf");
  Operation op = MakeOperation(none, DUMP, opts, 0, std::chrono::seconds(5), dir_ + "/dump.log");
  auto resp = criu::Run(op);
  ASSERT_FALSE(resp.ok());
  EXPECT_EQ(resp.status().code(), Code::kInvalidArgument);
  EXPECT_NE(resp.status().message().find(dir_ + "/no-such.conf"), std::string::npos) << resp.status().message();
}

}  // namespace
}  // namespace gpusnap::criu
