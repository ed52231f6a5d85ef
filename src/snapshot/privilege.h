// A restore never gives a process more privilege than its placeholder holds
// (docs/SECURITY.md, "A restore never gains privilege").
//
// CRIU, run by gpusnap with gpusnap's own privilege, gives each restored
// thread the credentials its dump recorded, whatever the container it lands
// in holds. So a restore into a placeholder container compares each thread's
// credentials with those of the placeholder's init, once from the snapshot's
// images before CRIU runs and once from /proc after CRIU, before any restored
// thread runs; a thread may hold nothing that a process started in the
// placeholder could not:
//
// - its uids (real, effective, saved, filesystem) among the init's, unless
//   the init holds CAP_SETUID; its gids and supplementary groups among the
//   init's gids and groups, unless it holds CAP_SETGID;
// - its permitted, effective and ambient capabilities within the init's
//   permitted set, its bounding set within the init's bounding set, its
//   inheritable set within what the init could make inheritable (its
//   inheritable and permitted sets; its bounding set too with CAP_SETPCAP);
// - no_new_privs set when the init's is;
// - seccomp: in strict mode when the init is; in filter mode (or strict)
//   when the init is filtered, bound by every filter that binds the init
//   (the same BPF program among its own; more filters only narrow it).
//
// The rule is stricter than what exec could reach in the placeholder (a
// root process without no_new_privs regains its bounding set at exec): it
// holds the restored tree to what the placeholder's init holds now, which is
// what the pod spec gave it. Securebits are not compared (/proc does not show
// them).
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>
#include <vector>

#include "gpusnap/status.h"
#include "proc/credentials.h"

namespace gpusnap {

// Pure: each way `task` exceeds `init`, as a phrase that follows the task's
// name ("runs as uid 0 (the placeholder's init: uid 1000, without
// CAP_SETUID)"); empty when it holds nothing the init could not.
std::vector<std::string> PrivilegeBeyond(const proc::Credentials& task, const proc::Credentials& init);

// A thread whose credentials a restore checks.
struct CheckedThread {
  pid_t pid = 0;  // its process's (in the snapshot's namespace, or the host's once restored)
  pid_t tid = 0;  // == pid for the main thread
  std::string comm;
  proc::Credentials creds;
};

// Pure: OK when no thread exceeds `init`; else kFailedPrecondition, one line:
// "<lead>: pid 7 (server) <where> holds CAP_SYS_ADMIN in its permitted,
// effective and bounding sets, which the placeholder's init does not;
// pid 9 (sh), pid 12 (worker) <where>: each runs as uid 0 (...)". Threads
// that exceed it alike are told together (three named, the rest counted);
// a thread that exceeds it as its process's main thread does goes unsaid.
Status CheckWithinPlaceholder(std::string_view lead, std::string_view where, const std::vector<CheckedThread>& threads,
                              const proc::Credentials& init);

}  // namespace gpusnap
