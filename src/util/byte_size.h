// Byte counts as people write them on a command line or in a settings file:
// "1073741824", "512M", "20G", "1.5T", "64KiB". The suffixes are binary
// (K = 1024, M = 1024^2, G = 1024^3, T = 1024^4, P = 1024^5), in either case,
// optionally followed by "iB" or "B"; a bare number is bytes, and so is a
// trailing "B" alone. A fraction is allowed before a suffix and the result is
// rounded down to whole bytes (its first 9 digits count). Pure: no I/O.
#pragma once

#include <cstdint>
#include <string_view>

#include "gpusnap/status.h"

namespace gpusnap {

// The bytes `text` says. kInvalidArgument quoting `text` when it is empty,
// negative, has anything but the shape above, or is more than 2^64 - 1 bytes.
Result<uint64_t> ParseByteSize(std::string_view text);

}  // namespace gpusnap
