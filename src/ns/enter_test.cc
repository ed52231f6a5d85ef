#include "ns/enter.h"

#include <gtest/gtest.h>

namespace gpusnap::ns {
namespace {

TEST(ContainerCredentials, ReadFromProcStatus) {
  auto c = ParseCredentials("Name:\tsh\nUid:\t1000\t1000\t1000\t1000\nGid:\t100\t100\t100\t100\n"
                            "CapInh:\t0000000000000000\nCapPrm:\t00000000a80425fb\nCapEff:\t00000000a80425fb\n"
                            "CapBnd:\t00000000a80425fb\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\n",
                            "/proc/7/status");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->uid, 1000u);
  EXPECT_EQ(c->gid, 100u);
  EXPECT_EQ(c->cap_bounding, 0xa80425fbull);
  EXPECT_EQ(c->cap_effective, 0xa80425fbull);
  EXPECT_EQ(c->cap_inheritable, 0u);
  EXPECT_TRUE(c->no_new_privs);
}

TEST(ContainerCredentials, AStatusWithoutThemIsRefusedNamingIt) {
  auto c = ParseCredentials("Name:\tsh\nUid:\t0\t0\t0\t0\n", "/proc/7/status");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("/proc/7/status"), std::string::npos);
}

}  // namespace
}  // namespace gpusnap::ns
