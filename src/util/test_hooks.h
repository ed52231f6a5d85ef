// Fault-injection points for the crash tests: with GPUSNAP_TEST_PAUSE_AT set
// to a phase name, gpusnap prints `paused at <phase>` on stderr when it
// reaches that phase and waits there to be killed; or, with
// GPUSNAP_TEST_RESUME_FILE set too, until that file exists, and then goes on
// (for tests that interleave two gpusnap processes). Costs one getenv otherwise.
#pragma once

#include <string_view>

namespace gpusnap {
void PauseIfRequested(std::string_view phase);
}
