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

struct DumpPlan {
  int root_pid = 0;             // REQUIRES: > 0, as seen from CRIU's pid namespace
  int images_dir_fd = -1;       // REQUIRES: >= 0, inherited by CRIU
  int work_dir_fd = -1;         // REQUIRES: >= 0, where CRIU writes its log
  std::string log_file;         // name inside the work dir
  bool leave_running = false;
  bool tcp_established = false;
  bool shell_job = false;       // the tree's session leader lives outside it
  bool verbose = false;
  std::string config_file;      // a CRIU configuration file to add, if any
};

struct RestorePlan {
  int images_dir_fd = -1;
  int work_dir_fd = -1;
  std::string log_file;
  bool tcp_established = false; // REQUIRES: the same as at dump
  bool shell_job = false;       // likewise
  bool verbose = false;
  std::string config_file;
};

criu_opts DumpOptions(const DumpPlan& plan, const Features& features);
criu_opts RestoreOptions(const RestorePlan& plan, const Features& features);

}  // namespace gpusnap::criu
