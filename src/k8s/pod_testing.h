// Test support for the webhook's unit tests (compiled into the unit tests
// only, from pod_testing_test.cc): pod fixtures, patch application, lookups.
//
// Every patch a test produces goes through ApplyPatch, which applies it with
// nlohmann-json and also with the real `kubectl patch --local --type=json`
// (the kubectl of scripts/fetch-kubectl.sh, run once if that kubectl is
// missing, or $GPUSNAP_KUBECTL) and fails the test when the two results
// differ. Without a kubectl the second application is skipped and
// KubectlMissing() says why.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "k8s/mutate.h"

namespace gpusnap::k8s::testing {

// tests/k8s/fixtures/<name>; aborts the test binary when unreadable.
nlohmann::json Fixture(const std::string& name);

// The pod after `patch`. Adds a gtest failure when kubectl disagrees or fails.
nlohmann::json ApplyPatch(const nlohmann::json& pod, const nlohmann::json& patch);

// Empty when kubectl is available; else a message for GTEST_SKIP.
std::string KubectlMissing();

// Runs the test kubectl with `args`: its exit status, and its stdout and
// stderr together.
struct KubectlRun {
  int status = -1;
  std::string output;
};
KubectlRun RunKubectl(const std::vector<std::string>& args);
// A private directory for a test's files, removed at exit.
const std::string& ScratchDir();

// MutatePod, the patch applied (ApplyPatch), and the result mutated again,
// expecting an empty second patch. Adds gtest failures; `pod` back on error.
struct Mutated {
  nlohmann::json pod;
  Mutation m;
};
Mutated MutateChecked(const nlohmann::json& pod, const MutateConfig& config = {});

// Lookups in a pod; null (or, for Container, a failure) when absent.
const nlohmann::json& Container(const nlohmann::json& pod, const std::string& name);  // init containers too
nlohmann::json Env(const nlohmann::json& container, const std::string& name);
nlohmann::json MountAt(const nlohmann::json& container, const std::string& path);
nlohmann::json Volume(const nlohmann::json& pod, const std::string& name);
bool HasWarningAbout(const Mutation& m, const std::string& word);

}  // namespace gpusnap::k8s::testing
