#include "snapshot/checkpointable.h"

#include <gtest/gtest.h>

namespace gpusnap {
namespace {

ProcessFiles Plain(pid_t pid) {
  return {pid, {"python3", "serve.py"}, {{0, "/dev/null"}, {3, "socket:[123]"}, {4, "anon_inode:[eventpoll]"}},
          {"/usr/bin/python3.11", "[heap]", "/dev/nvidia0"}};
}

TEST(Checkpointable, OrdinaryFilesPass) { EXPECT_TRUE(CheckCheckpointable({Plain(10), Plain(11)}).ok()); }

TEST(Checkpointable, AnOpenIoUringIsRefusedNamingTheProcessAndFd) {
  ProcessFiles ring = Plain(11);
  ring.cmdline = {"python3", "-m", "torch.distributed.run", "--nproc-per-node", "2", "tp.py"};
  ring.fds.emplace_back(7, "anon_inode:[io_uring]");
  Status st = CheckCheckpointable({Plain(10), ring});
  EXPECT_EQ(st.code(), Code::kFailedPrecondition);
  EXPECT_NE(st.message().find("pid 11 (`python3 -m torch.distributed.run --nproc-per-node 2 tp.py`)"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("an io_uring instance (fd 7)"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("gpusnap run --gpushare"), std::string::npos) << st.message();
}

TEST(Checkpointable, ARingOnlyMappedIsRefusedToo) {
  ProcessFiles ring = Plain(12);
  ring.mapped.push_back("anon_inode:[io_uring]");
  Status st = CheckCheckpointable({ring});
  EXPECT_EQ(st.code(), Code::kFailedPrecondition);
  EXPECT_NE(st.message().find("pid 12"), std::string::npos);
  EXPECT_NE(st.message().find("mapped, its fd closed"), std::string::npos) << st.message();
}

TEST(Checkpointable, AGoneProcessHasNothingToRefuse) {
  EXPECT_TRUE(CheckCheckpointable({ProcessFiles{99, {}, {}, {}}}).ok());
}

}  // namespace
}  // namespace gpusnap
