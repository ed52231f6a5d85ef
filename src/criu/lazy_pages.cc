#include "criu/lazy_pages.h"

namespace gpusnap::criu {

std::vector<std::string> LazyPagesArgs(const LazyPagesPlan& plan) {
  return {"lazy-pages",
          "--images-dir", plan.images_dir,
          "--work-dir", plan.work_dir,
          "--log-file", kLazyPagesLog,
          plan.verbose ? "-v4" : "-v2",
          "--status-fd", std::to_string(plan.status_fd)};
}

Status LazyPagesVerdict(const Captured& check) {
  if (check.exit_status == 0) return Status::Ok();
  std::string said = check.output;
  while (!said.empty() && (said.back() == '\n' || said.back() == ' ')) said.pop_back();
  for (char& c : said)
    if (c == '\n') c = ' ';
  return Status::Error(Code::kNotSupported,
                       "--lazy-pages needs the kernel's userfaultfd with non-cooperative events (fork, remap, unmap), "
                       "which this node lacks (`criu check --feature uffd-noncoop` exited with status {}{}); restore "
                       "without --lazy-pages",
                       check.exit_status, said.empty() ? "" : ": " + said);
}

Status CheckLazyPages(const Bundle& bundle) {
  GPUSNAP_ASSIGN_OR_RETURN(Captured check, RunCaptured(bundle.Argv({"check", "--feature", "uffd-noncoop"}), 10000));
  return LazyPagesVerdict(check);
}

}  // namespace gpusnap::criu
