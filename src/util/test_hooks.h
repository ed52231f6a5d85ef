// Fault-injection points for the crash and undo tests. Each costs one getenv
// when unused.
//
// - GPUSNAP_TEST_PAUSE_AT=<step>: gpusnap prints `paused at <step>` on stderr
//   when it reaches that step and waits there to be killed; or, with
//   GPUSNAP_TEST_RESUME_FILE set too, until that file exists, and then goes
//   on (for tests that interleave two gpusnap processes).
// - GPUSNAP_TEST_FAIL_AT=<step>: the step fails as a real failure would, with
//   kInternal "injected failure at <step>", and the story undoes what it did.
// - GPUSNAP_TEST_SKIP_AT=<step>: a check at that step is not made, so that a
//   test can show that the check after it catches what it would have (the
//   restore's privilege check before CRIU, whose twin runs after CRIU).
// - GPUSNAP_TEST_LAZY_PAGES_STOPPED=1: a `restore --lazy-pages` stops (SIGSTOP)
//   its lazy-pages daemon once CRIU has restored the tree (at post-restore),
//   before it copies any page in the background: the pages the tree has not
//   faulted in cannot all be in before a test kills the daemon.
// - GPUSNAP_TEST_STOP_AFTER_LET_GO=1: a restore's or a wake's let-go
//   (snapshot/gpu_steps.h, LetTreeGo) stops (SIGSTOP) the restored tree's
//   first task once it has let the tree go, as a stop that came after its
//   SIGCONT would: the let-go's check must catch it and fail.
#pragma once

#include <string_view>

#include "gpusnap/status.h"

namespace gpusnap {

void PauseIfRequested(std::string_view step);
[[nodiscard]] Status InjectedFailure(std::string_view step);
bool SkipRequested(std::string_view step);

}  // namespace gpusnap
