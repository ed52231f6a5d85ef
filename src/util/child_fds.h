// What a child between fork and exec keeps of its parent's descriptors.
#pragma once

#include <initializer_list>

namespace gpusnap {

// stdin on /dev/null, stdout and stderr on `output` (-1: /dev/null too);
// every other descriptor closed at the exec but those in `keep` (negative
// ones ignored). Only system calls (async-signal-safe): for the child of a
// parent that may have threads.
void DetachStdio(int output, std::initializer_list<int> keep);

}  // namespace gpusnap
