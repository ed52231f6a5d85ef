#include "criu/options.h"

namespace gpusnap::criu {

namespace {
// Deleted-but-open files are stored whole in the images; CRIU's 1 MiB default
// refuses ordinary scratch files.
constexpr uint32_t kGhostLimitBytes = 256u << 20;

// Level 2 keeps errors and warnings: what a failure report needs, without the
// cost of logging every page at level 4.
int LogLevel(bool verbose) { return verbose ? 4 : 2; }

void Common(criu_opts& o, const CommonPlan& plan, const Features& features) {
  if (!plan.config_file.empty()) o.set_config_file(plan.config_file);
  o.set_images_dir_fd(plan.images_dir_fd);
  o.set_work_dir_fd(plan.work_dir_fd);
  o.set_log_file(plan.log_file);
  o.set_log_level(LogLevel(plan.verbose));
  o.set_shell_job(plan.shell_job);
  o.set_file_locks(true);
  o.set_ghost_limit(kGhostLimitBytes);
  // gpusnap acts at post-dump / post-restore while the tree is still frozen.
  o.set_notify_scripts(true);
  if (plan.tcp_established) {
    o.set_tcp_established(true);
    // Established connections are kept quiet by a network lock while frozen;
    // nftables needs no iptables binary on the host.
    if (features.nftables) o.set_network_lock(NFTABLES);
  }
}
}  // namespace

criu_opts DumpOptions(const DumpPlan& plan, const Features& features) {
  criu_opts o;
  Common(o, plan, features);
  o.set_pid(plan.root_pid);
  o.set_leave_running(plan.leave_running);
  return o;
}

criu_opts RestoreOptions(const RestorePlan& plan, const Features& features) {
  criu_opts o;
  Common(o, plan, features);
  if (plan.keep_criu_cgroups) {
    o.set_manage_cgroups(true);
    o.set_manage_cgroups_mode(IGNORE);
  }
  if (plan.leave_stopped) o.set_leave_stopped(true);
  if (plan.lazy_pages) o.set_lazy_pages(true);
  return o;
}

}  // namespace gpusnap::criu
