#include "container/containers.h"

#include <gtest/gtest.h>

namespace gpusnap::container {
namespace {

const std::string kA(64, 'a');
const std::string kB = std::string(12, 'a') + std::string(52, 'b');

NodeProcess P(pid_t pid, pid_t ppid, const std::string& container, bool init = false) {
  NodeProcess p;
  p.pid = pid;
  p.ppid = ppid;
  p.container_id = container;
  p.namespace_init = init;
  p.command = "proc" + std::to_string(pid);
  return p;
}

TEST(AgentContainerTree, TheOneChildOfTheInit) {
  std::vector<NodeProcess> procs = {P(1, 0, ""), P(100, 1, ""), P(200, 100, kA, true), P(201, 200, kA),
                                    P(202, 201, kA)};
  auto root = ContainerTreeRoot(procs, kA);
  ASSERT_TRUE(root.ok()) << root.status().ToString();
  EXPECT_EQ(*root, 201);
}

TEST(AgentContainerTree, InitAloneIsRefusedWithTheReason) {
  std::vector<NodeProcess> procs = {P(200, 100, kA, true)};
  auto root = ContainerTreeRoot(procs, kA);
  EXPECT_EQ(root.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(root.status().message().find("only process"), std::string::npos);
}

TEST(AgentContainerTree, SeveralTreesAreRefused) {
  std::vector<NodeProcess> procs = {P(200, 100, kA, true), P(201, 200, kA), P(202, 200, kA)};
  EXPECT_EQ(ContainerTreeRoot(procs, kA).status().code(), Code::kFailedPrecondition);
}

TEST(AgentContainerTree, NoInitIsNotFound) {
  std::vector<NodeProcess> procs = {P(201, 200, kA)};
  EXPECT_EQ(ContainerTreeRoot(procs, kA).status().code(), Code::kNotFound);
}

TEST(AgentContainerId, PrefixExpands) {
  std::vector<NodeProcess> procs = {P(5, 1, kA), P(6, 1, kB)};
  EXPECT_EQ(*ExpandContainerId(procs, kA), kA);
  EXPECT_EQ(*ExpandContainerId(procs, kB.substr(0, 13)), kB);
  EXPECT_EQ(ExpandContainerId(procs, std::string(12, 'a')).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ExpandContainerId(procs, std::string(12, 'c')).status().code(), Code::kNotFound);
}


TEST(AgentContainerInit, TheInitOfTheContainersNamespace) {
  std::vector<NodeProcess> procs = {P(1, 0, ""), P(200, 100, kA, true), P(201, 200, kA), P(300, 1, kB, true)};
  auto init = ContainerInit(procs, kA);
  ASSERT_TRUE(init.ok()) << init.status().ToString();
  EXPECT_EQ(*init, 200);
  EXPECT_EQ(ContainerInit(procs, std::string(64, 'c')).status().code(), Code::kNotFound);
  procs.push_back(P(400, 1, kA, true));
  EXPECT_EQ(ContainerInit(procs, kA).status().code(), Code::kFailedPrecondition);
}

}  // namespace
}  // namespace gpusnap::container
