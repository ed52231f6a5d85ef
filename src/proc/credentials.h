// What a task may do, as the kernel keeps it: its uids and gids, its
// supplementary groups, its five capability sets, no_new_privs and its
// seccomp mode and filters. Read from /proc/<pid>/status (a placeholder's
// init, a restored task) and, for a snapshot's tasks, from CRIU's images
// (criu/task_credentials.h), so that a restore compares like with like
// (snapshot/privilege.h).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpusnap/status.h"

namespace gpusnap::proc {

// The seccomp modes, as SECCOMP_MODE_* and /proc/<pid>/status number them.
enum class SeccompMode : int { kDisabled = 0, kStrict = 1, kFilter = 2 };

struct Credentials {
  uid_t uid = 0, euid = 0, suid = 0, fsuid = 0;  // real, effective, saved, filesystem
  gid_t gid = 0, egid = 0, sgid = 0, fsgid = 0;
  std::vector<gid_t> groups;  // supplementary
  uint64_t cap_inheritable = 0, cap_permitted = 0, cap_effective = 0, cap_bounding = 0, cap_ambient = 0;
  bool no_new_privs = false;
  SeccompMode seccomp_mode = SeccompMode::kDisabled;
  // In filter mode: each filter's BPF program (its struct sock_filter array,
  // as the kernel returns it to PTRACE_SECCOMP_GET_FILTER and CRIU stores
  // it), newest first. /proc/<pid>/status does not show them: read them with
  // ns::ReadSeccompFilters; a snapshot's come from its images.
  std::vector<std::string> seccomp_filters;
};

// Pure: the credentials of a /proc/<pid>/status text (seccomp_filters left
// empty). kInternal naming `where` when it lacks Uid, Gid or CapBnd.
Result<Credentials> ParseStatusCredentials(std::string_view status, std::string_view where);

// /proc/<pid>/task/<tid>/status read and parsed (tid == pid: the process's
// main thread). kNotFound when the task is gone.
Result<Credentials> ReadTaskCredentials(pid_t pid, pid_t tid);

}  // namespace gpusnap::proc
