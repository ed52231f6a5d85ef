// The CRIU options for a dump and a restore, decided in one pure function each
// so every choice is unit-tested without running CRIU.
#pragma once

#include <string>

#include "rpc.pb.h"

namespace gpusnap::criu {

// What the running CRIU can do, detected at run time (see bundle.h).
struct Features {
  int version_major = 0;
  int version_minor = 0;
  bool nftables = false;  // network_lock = NFTABLES understood
};

// What a dump and a restore have in common.
struct CommonPlan {
  int images_dir_fd = -1;       // REQUIRES: >= 0, inherited by CRIU
  int work_dir_fd = -1;         // REQUIRES: >= 0, where CRIU writes its log
  std::string log_file;         // name inside the work dir
  bool tcp_established = false; // restore: REQUIRES the same as at dump
  bool shell_job = false;       // the tree's session leader lives outside it (likewise)
  bool verbose = false;
  std::string config_file;      // a CRIU configuration file to add, if any
};

struct DumpPlan : CommonPlan {
  int root_pid = 0;             // REQUIRES: > 0, as seen from CRIU's pid namespace
  bool leave_running = false;
};

struct RestorePlan : CommonPlan {
  // The tree stays in the cgroups CRIU runs in (a restore into a container,
  // whose cgroups CRIU joined): CRIU neither recreates nor moves to the
  // dumped ones, which belonged to the source.
  bool keep_criu_cgroups = false;
  // Every restored task stays stopped (SIGSTOP) until gpusnap continues it:
  // the snapshot's digests are still being checked while CRIU restores.
  bool leave_stopped = false;
  // Private anonymous memory is left to a `criu lazy-pages` daemon listening
  // in the work dir (criu/lazy_pages.h); REQUIRES: it is listening.
  bool lazy_pages = false;
};

criu_opts DumpOptions(const DumpPlan& plan, const Features& features);
criu_opts RestoreOptions(const RestorePlan& plan, const Features& features);

}  // namespace gpusnap::criu
