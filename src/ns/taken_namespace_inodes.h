// The pid-namespace inodes that bound abstract unix socket names still carry.
//
// The CUDA driver binds `@cuda-uvmfd-<pid namespace inode>-<pid>@` in each
// process at cuInit. Abstract names live in the network namespace, which every
// workload shares with the node; a CUDA process restored by CRIU keeps the
// name it had, with the inode of a pid namespace that is gone. The kernel
// hands a freed inode number to the next namespace it makes, so a new
// workload namespace may get that very number, and its process at the same
// pid then fails cuInit with CUDA_ERROR_OPERATING_SYSTEM (bind: EADDRINUSE).
// A new namespace whose inode a name still carries is therefore refused and
// another made in its place (ns/reaper.h, SpawnReaper).
#pragma once

#include <cstdint>
#include <set>
#include <string_view>

namespace gpusnap::ns {

// Pure. From /proc/net/unix's text: the pid-namespace inodes in the CUDA
// driver's socket names bound there.
std::set<uint64_t> NamespaceInodesInCudaSocketNames(std::string_view proc_net_unix);

}  // namespace gpusnap::ns
