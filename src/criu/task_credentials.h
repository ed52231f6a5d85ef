// The credentials a CRIU dump recorded for each thread of the tree, which a
// restore gives back whatever the namespace it restores into holds: uids,
// gids, supplementary groups, the capability sets, no_new_privs and the
// seccomp mode and filters.
//
// Read from the images (image_reader.h): pstree.img for the processes and
// their threads, each thread's core-<tid>.img (core_entry.thread_core.creds
// and its seccomp_mode and seccomp_filter, or task_core_entry's older
// seccomp fields) and seccomp.img for the filters themselves. A thread whose
// image says no seccomp while its process's filters carry TSYNC takes those
// filters, as CRIU's restore gives them (CRIU records a chain every thread
// shares once, on the main thread, with that flag).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "gpusnap/status.h"
#include "proc/credentials.h"

namespace gpusnap::criu {

struct DumpedThread {
  pid_t pid = 0;  // its process's pid in the snapshot's pid namespace
  pid_t tid = 0;  // the thread's; == pid for the main thread
  std::string comm;
  proc::Credentials creds;
};

// Every thread of every live process of the dump in `images_dir` (a zombie
// runs nothing and holds no credentials), processes in pstree order, each
// main thread first. kCorruption naming the image when one is missing or not
// as CRIU writes it (a live thread without credentials, a filter index out
// of range); kIoError when a file cannot be read.
Result<std::vector<DumpedThread>> ReadDumpedCredentials(const std::string& images_dir);

}  // namespace gpusnap::criu
