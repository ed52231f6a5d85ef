#include "criu/operation.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "util/files.h"

namespace gpusnap::criu {
namespace {

class ConfigFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpusnap-criu-config-test-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  void TearDown() override { (void)RemoveTree(dir_); }
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
