// Finding the self-contained CRIU bundle (scripts/build-criu-bundle.sh) and
// asking it what it can do.
//
// The bundle carries its own glibc and loader; its binaries are started as
// `<dir>/lib/ld-linux-x86-64.so.2 <dir>/bin/criu ...` with RPATH=$ORIGIN, so no
// LD_LIBRARY_PATH is ever set and nothing CRIU execs inherits bundle paths.
#pragma once

#include <string>
#include <vector>

#include "criu/options.h"
#include "gpusnap/status.h"

namespace gpusnap::criu {

struct Bundle {
  std::string dir;
  std::string loader;        // <dir>/lib/ld-linux-x86-64.so.2
  std::string criu;          // <dir>/bin/criu
  std::string version_line;  // <dir>/VERSION, e.g. "criu 4.3 (4.3-1, experimental)"

  // argv that runs the bundle's criu with `args`.
  std::vector<std::string> Argv(const std::vector<std::string>& args) const;
};

// Looks in order at: `configured` (a --criu flag), $GPUSNAP_CRIU, <dir of the
// gpusnap binary>/criu-bundle, and the install location chosen at build time.
// kNotFound lists every place it looked.
Result<Bundle> FindBundle(const std::string& configured);

// Version from `criu --version`; optional features from `criu check --feature`.
Result<Features> DetectFeatures(const Bundle& bundle, bool need_network_lock);

// Runs argv, returns exit status and combined output (for version/check).
struct Captured {
  int exit_status = -1;
  std::string output;
};
Result<Captured> RunCaptured(const std::vector<std::string>& argv, int timeout_ms);

}  // namespace gpusnap::criu
