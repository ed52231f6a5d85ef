#include "util/test_hooks.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace gpusnap {

void PauseIfRequested(std::string_view step) {
  const char* want = std::getenv("GPUSNAP_TEST_PAUSE_AT");
  if (want == nullptr || step != want) return;
  std::fprintf(stderr, "paused at %s\n", want);
  std::fflush(stderr);
  const char* resume = std::getenv("GPUSNAP_TEST_RESUME_FILE");
  if (resume == nullptr || *resume == '\0') {
    for (;;) ::pause();
  }
  while (::access(resume, F_OK) != 0) ::usleep(10 * 1000);
}

Status InjectedFailure(std::string_view step) {
  const char* want = std::getenv("GPUSNAP_TEST_FAIL_AT");
  if (want == nullptr || step != want) return Status::Ok();
  return Status::Error(Code::kInternal, "injected failure at {}", step);
}

bool SkipRequested(std::string_view step) {
  const char* want = std::getenv("GPUSNAP_TEST_SKIP_AT");
  return want != nullptr && step == want;
}

}  // namespace gpusnap
