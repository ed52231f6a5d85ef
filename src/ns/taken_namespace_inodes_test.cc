#include "ns/taken_namespace_inodes.h"

#include <gtest/gtest.h>

namespace gpusnap::ns {
namespace {

// As /proc/net/unix shows them, from a GPU node with two restored CUDA
// processes and a host one.
constexpr std::string_view kProcNetUnix =
    "Num       RefCount Protocol Flags    Type St Inode Path\n"
    "0000000000000000: 00000002 00000000 00010000 0001 01 30411 @cuda-uvmfd-4026532262-2@\n"
    "0000000000000000: 00000002 00000000 00010000 0001 01 30977 @cuda-uvmfd-4026532269-2@\n"
    "0000000000000000: 00000002 00000000 00010000 0001 01 21001 @cuda-uvmfd-4026531836-6392@\n"
    "0000000000000000: 00000003 00000000 00000000 0001 03 18211 /run/containerd/containerd.sock\n"
    "0000000000000000: 00000002 00000000 00010000 0001 01 30978 @gpusnap-gpushare.4026532270.2\n"
    "0000000000000000: 00000002 00000000 00010000 0001 01 30979 @cuda-uvmfd-notanumber-2@\n"
    "0000000000000000: 00000002 00000000 00010000 0001 01 30980 @cuda-uvmfd-77\n"
    "0000000000000000: 00000003 00000000 00000000 0001 03 18212\n";

TEST(NamespaceInodesInCudaSocketNames, TheDriversNamesOnly) {
  EXPECT_EQ(NamespaceInodesInCudaSocketNames(kProcNetUnix),
            (std::set<uint64_t>{4026531836, 4026532262, 4026532269}));
}

TEST(NamespaceInodesInCudaSocketNames, NoneInAnEmptyTable) {
  EXPECT_TRUE(NamespaceInodesInCudaSocketNames("").empty());
  EXPECT_TRUE(NamespaceInodesInCudaSocketNames("Num       RefCount Protocol Flags    Type St Inode Path\n").empty());
}

}  // namespace
}  // namespace gpusnap::ns
