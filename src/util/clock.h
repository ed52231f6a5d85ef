// The wall clock as gpusnap writes it into records, logs and state files.
#pragma once

#include <string>

namespace gpusnap {

// Now, as RFC 3339 UTC with milliseconds: "2024-05-01T12:00:00.123Z".
std::string NowRfc3339();

}  // namespace gpusnap
