// Test support: drives the fake libcuda (tests/fakes/libcuda) from GoogleTest.
// A FakeCuda gives each test a fresh call log and a fresh per-pid state file,
// and reads the log back. Header-only; unit tests only.
//
// Not thread-safe: set up before the operation under test starts.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/driver.h"

#ifndef GPUSNAP_FAKE_CUDA_DIR
#error "GPUSNAP_FAKE_CUDA_DIR must name the fake libcuda's directory (tests/CMakeLists.txt)"
#endif

namespace gpusnap::cuda::fakes {

// One line of FAKE_CUDA_LOG.
struct FakeCall {
  long long t = 0, start = 0;  // CLOCK_MONOTONIC ns: end and start of the call
  long tid = 0;
  std::string fn;
  int pid = 0;
  int rc = 0;
  std::map<std::string, std::string> extra;  // timeout_ms, pairs, state, count, ...
};

class FakeCuda {
 public:
  FakeCuda() {
    char tmpl[] = "/tmp/gpusnap-fake-cuda-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    for (const char* v : kKnobs) ::unsetenv(v);
    ::setenv("FAKE_CUDA_LOG", (dir_ + "/calls.log").c_str(), 1);
    ::setenv("FAKE_CUDA_STATE_FILE", (dir_ + "/states").c_str(), 1);
  }
  ~FakeCuda() {
    for (const char* v : kKnobs) ::unsetenv(v);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  FakeCuda(const FakeCuda&) = delete;
  FakeCuda& operator=(const FakeCuda&) = delete;

  // Sets FAKE_CUDA_<knob>, e.g. Set("FAIL", "cuCheckpointProcessLock:222:600").
  void Set(const std::string& knob, const std::string& value) { ::setenv(("FAKE_CUDA_" + knob).c_str(), value.c_str(), 1); }

  static std::string Library(const std::string& variant = "") {
    return std::string(GPUSNAP_FAKE_CUDA_DIR) + (variant.empty() ? "" : "/" + variant) + "/libcuda.so.1";
  }
  static Result<Driver> Load(const std::string& variant = "") {
    LoadOptions options;
    options.library = Library(variant);
    return Driver::Load(options);
  }

  // Every call logged so far, in log order; only those of `fn` when given.
  std::vector<FakeCall> Calls(const std::string& fn = "") const {
    std::vector<FakeCall> out;
    std::ifstream in(dir_ + "/calls.log");
    for (std::string line; std::getline(in, line);) {
      FakeCall c;
      std::istringstream words(line);
      for (std::string w; words >> w;) {
        size_t eq = w.find('=');
        std::string k = w.substr(0, eq), v = w.substr(eq + 1);
        if (k == "t") c.t = std::stoll(v);
        else if (k == "start") c.start = std::stoll(v);
        else if (k == "tid") c.tid = std::stol(v);
        else if (k == "fn") c.fn = v;
        else if (k == "pid") c.pid = std::stoi(v);
        else if (k == "rc") c.rc = std::stoi(v);
        else c.extra[k] = v;
      }
      if (fn.empty() || c.fn == fn) out.push_back(c);
    }
    return out;
  }
  // Clears the log (not the states).
  void ClearLog() const { std::ofstream(dir_ + "/calls.log", std::ios::trunc); }

 private:
  static constexpr const char* kKnobs[] = {"FAKE_CUDA_LOG",  "FAKE_CUDA_STATE_FILE",     "FAKE_CUDA_GPUS",
                                           "FAKE_CUDA_FAIL", "FAKE_CUDA_DRIVER_VERSION", "FAKE_CUDA_DELAY_MS"};
  std::string dir_;
};

}  // namespace gpusnap::cuda::fakes
