#include "container/cgroup.h"

#include <gtest/gtest.h>

namespace gpusnap::container {
namespace {

const std::string kId = "3f2a9c1e0b7d4a5f8e6c2b1a0d9f8e7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e";
const std::string kUid = "0c5b1d7e-2f4a-4b8c-9d3e-1a2b3c4d5e6f";
std::string Underscored(std::string s) {
  for (char& c : s)
    if (c == '-') c = '_';
  return s;
}

TEST(AgentCgroup, ContainerdSystemdV2) {
  auto id = ParseProcCgroup("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" +
                            Underscored(kUid) + ".slice/cri-containerd-" + kId + ".scope\n");
  EXPECT_EQ(id.container_id, kId);
  EXPECT_EQ(id.pod_uid, kUid);
}

TEST(AgentCgroup, CrioSystemdV2) {
  auto id = ParseProcCgroup("0::/kubepods.slice/kubepods-pod" + Underscored(kUid) + ".slice/crio-" + kId + ".scope\n");
  EXPECT_EQ(id.container_id, kId);
  EXPECT_EQ(id.pod_uid, kUid);
}

TEST(AgentCgroup, CrioMonitorIsNotTheContainer) {
  auto id = ParseProcCgroup("0::/kubepods.slice/kubepods-pod" + Underscored(kUid) + ".slice/crio-conmon-" + kId +
                            ".scope\n");
  EXPECT_EQ(id.container_id, "");
}

TEST(AgentCgroup, CgroupfsDriverV1) {
  std::string text = "12:pids:/kubepods/burstable/pod" + kUid + "/" + kId + "\n" +
                     "11:cpu,cpuacct:/kubepods/burstable/pod" + kUid + "/" + kId + "\n" + "1:name=systemd:/\n";
  auto id = ParseProcCgroup(text);
  EXPECT_EQ(id.container_id, kId);
  EXPECT_EQ(id.pod_uid, kUid);
}

TEST(AgentCgroup, DockerOutsideKubernetes) {
  EXPECT_EQ(ParseProcCgroup("0::/system.slice/docker-" + kId + ".scope\n").container_id, kId);
  auto id = ParseProcCgroup("0::/docker/" + kId + "\n");
  EXPECT_EQ(id.container_id, kId);
  EXPECT_EQ(id.pod_uid, "");
}

TEST(AgentCgroup, HostProcessesAreInNoContainer) {
  EXPECT_EQ(ParseProcCgroup("0::/system.slice/ssh.service\n").container_id, "");
  EXPECT_EQ(ParseProcCgroup("0::/user.slice/user-0.slice/session-3.scope\n").container_id, "");
  EXPECT_EQ(ParseProcCgroup("0::/\n").container_id, "");
  EXPECT_EQ(ParseProcCgroup("").container_id, "");
  EXPECT_EQ(ParseProcCgroup("garbage without colons").container_id, "");
}

TEST(AgentCgroup, AlmostIdsAreNot) {
  EXPECT_FALSE(ContainerIdFromComponent(kId.substr(1)));
  EXPECT_FALSE(ContainerIdFromComponent(kId + "0"));
  std::string upper = kId;
  upper[0] = 'F';
  EXPECT_FALSE(ContainerIdFromComponent(upper));
  EXPECT_FALSE(ContainerIdFromComponent("cri-containerd-" + kId));  // no .scope
  EXPECT_FALSE(PodUidFromComponent("pod" + Underscored(kUid)));
  EXPECT_FALSE(PodUidFromComponent("pod" + kUid.substr(1)));
  EXPECT_FALSE(PodUidFromComponent("system-pod" + Underscored(kUid) + ".slice"));
}

TEST(AgentKubeletLogName, Parses) {
  auto n = ParseKubeletLogName("vllm-0_ml_server-" + kId + ".log");
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(n->pod, "vllm-0");
  EXPECT_EQ(n->namespace_name, "ml");
  EXPECT_EQ(n->container, "server");
  EXPECT_EQ(n->container_id, kId);
}

TEST(AgentKubeletLogName, Refuses) {
  EXPECT_FALSE(ParseKubeletLogName("vllm-0_ml_server-" + kId));            // no .log
  EXPECT_FALSE(ParseKubeletLogName("vllm-0_ml_server" + kId + ".log"));    // no '-'
  EXPECT_FALSE(ParseKubeletLogName("vllm-0_server-" + kId + ".log"));      // no namespace
  EXPECT_FALSE(ParseKubeletLogName("a_b_c_d-" + kId + ".log"));             // too many fields
  EXPECT_FALSE(ParseKubeletLogName("_ml_server-" + kId + ".log"));
  EXPECT_FALSE(ParseKubeletLogName(".log"));
  EXPECT_FALSE(ParseKubeletLogName("a/b_ml_server-" + kId + ".log"));     // found by the fuzzer
  EXPECT_FALSE(ParseKubeletLogName("Pod_ml_server-" + kId + ".log"));
}


const char* kHybridMountinfo =
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n"
    "40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

TEST(AgentCgroupProcs, EveryV1HierarchyAndTheUnifiedOne) {
  auto files = CgroupProcsFiles(
      "12:cpu,cpuacct:/top/pod1/abc\n11:memory:/top/pod1/abc\n10:name=systemd:/\n9:blkio:/x\n0::/\n",
      kHybridMountinfo);
  // blkio is mounted nowhere here: left out.
  EXPECT_EQ(files, (std::vector<std::string>{"/sys/fs/cgroup/cpu,cpuacct/top/pod1/abc/cgroup.procs",
                                              "/sys/fs/cgroup/memory/top/pod1/abc/cgroup.procs",
                                              "/sys/fs/cgroup/systemd/cgroup.procs",
                                              "/sys/fs/cgroup/unified/cgroup.procs"}));
}

TEST(AgentCgroupProcs, PureV2) {
  auto files = CgroupProcsFiles("0::/kubepods.slice/cri-containerd-abc.scope\n",
                                "25 20 0:23 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n");
  EXPECT_EQ(files, (std::vector<std::string>{"/sys/fs/cgroup/kubepods.slice/cri-containerd-abc.scope/cgroup.procs"}));
}

TEST(AgentCgroupProcs, AMountOfASubtreeOnlyForPathsUnderIt) {
  const char* mountinfo = "25 20 0:23 /kubepods /mnt/cg rw - cgroup2 cgroup2 rw\n";
  EXPECT_EQ(CgroupProcsFiles("0::/kubepods/pod1/abc\n", mountinfo),
            (std::vector<std::string>{"/mnt/cg/pod1/abc/cgroup.procs"}));
  EXPECT_TRUE(CgroupProcsFiles("0::/kubepodsX/abc\n", mountinfo).empty());
  EXPECT_TRUE(CgroupProcsFiles("0::/other\n", mountinfo).empty());
}

TEST(AgentCgroupProcs, NothingMountedOrGarbage) {
  EXPECT_TRUE(CgroupProcsFiles("0::/a\n", "").empty());
  EXPECT_TRUE(CgroupProcsFiles("garbage\n", kHybridMountinfo).empty());
}

}  // namespace
}  // namespace gpusnap::container
