// Helpers of the webhook unit tests: the kubectl cross-check behind every
// patch, and tests of it.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "k8s/pod_testing.h"
#include "util/files.h"

namespace gpusnap::k8s::testing {

using nlohmann::json;

namespace {

std::string Kubectl() {
  const char* env = std::getenv("GPUSNAP_KUBECTL");
  return env != nullptr && *env != '\0' ? env : GPUSNAP_TEST_KUBECTL;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs argv with stdout and stderr into `out`; returns the exit status.
int RunCapture(const std::vector<std::string>& argv, std::string& out) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

// A private scratch directory, removed at exit.
const std::string& Scratch() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/gpusnap-kubectl-XXXXXX";
    std::string d = mkdtemp(tmpl) != nullptr ? tmpl : "/tmp";
    std::atexit([] { (void)RemoveTree(Scratch()); });
    return d;
  }();
  return dir;
}

}  // namespace

KubectlRun RunKubectl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {Kubectl()};
  argv.insert(argv.end(), args.begin(), args.end());
  KubectlRun run;
  run.status = RunCapture(argv, run.output);
  return run;
}

const std::string& ScratchDir() { return Scratch(); }

json Fixture(const std::string& name) {
  std::string text = ReadAll(std::string(GPUSNAP_TEST_FIXTURES) + "/" + name);
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) {
    std::fprintf(stderr, "fixture %s missing or not JSON\n", name.c_str());
    std::abort();
  }
  return j;
}

std::string KubectlMissing() {
  auto works = [] {
    std::string out;
    return access(Kubectl().c_str(), X_OK) == 0 && RunCapture({Kubectl(), "version", "--client"}, out) == 0;
  };
  // As the e2e test does: fetch Debian's kubectl once (cached, idempotent)
  // unless the caller named one.
  static const bool ok = [&] {
    if (works() || std::getenv("GPUSNAP_KUBECTL") != nullptr) return works();
    std::string out;
    int rc = RunCapture({std::string(GPUSNAP_TEST_FIXTURES) + "/../../../scripts/fetch-kubectl.sh", Kubectl()}, out);
    if (rc != 0) std::fprintf(stderr, "scripts/fetch-kubectl.sh failed:\n%s", out.c_str());
    return works();
  }();
  if (ok) return "";
  return "no working kubectl at " + Kubectl() + " (scripts/fetch-kubectl.sh could not fetch it; or set GPUSNAP_KUBECTL)";
}

json ApplyPatch(const json& pod, const json& patch) {
  json mine = pod.patch(patch);
  if (!KubectlMissing().empty() || patch.empty()) return mine;  // kubectl refuses an empty patch
  std::string file = Scratch() + "/pod.json";
  std::ofstream(file) << pod.dump();
  std::string out;
  int rc = RunCapture({Kubectl(), "patch", "--local", "--type=json", "-f", file, "-p", patch.dump(), "-o", "json"}, out);
  EXPECT_EQ(rc, 0) << "kubectl patch failed: " << out << "\npatch: " << patch.dump(2);
  json theirs = json::parse(out, nullptr, false);
  EXPECT_EQ(theirs, mine) << "kubectl and nlohmann-json disagree on patch " << patch.dump(2);
  return mine;
}

Mutated MutateChecked(const json& pod, const MutateConfig& config) {
  auto m = MutatePod(pod, config);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return {pod, {}};
  json out = ApplyPatch(pod, m->patch);
  auto again = MutatePod(out, config);
  EXPECT_TRUE(again.ok()) << again.status().ToString();
  if (again.ok()) {
    EXPECT_EQ(again->patch, json::array()) << "the second pass is not empty";
  }
  return {out, *m};
}

const json& Container(const json& pod, const std::string& name) {
  const json& spec = pod.at("spec");
  for (const char* list : {"containers", "initContainers"}) {
    if (!spec.contains(list)) continue;
    for (const json& c : spec[list])
      if (c["name"] == name) return c;
  }
  static const json kNone;
  ADD_FAILURE() << "no container " << name;
  return kNone;
}

json Env(const json& c, const std::string& name) {
  for (const json& e : c.value("env", json::array()))
    if (e["name"] == name) return e;
  return nullptr;
}

json MountAt(const json& c, const std::string& path) {
  for (const json& m : c.value("volumeMounts", json::array()))
    if (m["mountPath"] == path) return m;
  return nullptr;
}

json Volume(const json& pod, const std::string& name) {
  for (const json& v : pod["spec"].value("volumes", json::array()))
    if (v["name"] == name) return v;
  return nullptr;
}

bool HasWarningAbout(const Mutation& m, const std::string& word) {
  for (const auto& w : m.warnings)
    if (w.find(word) != std::string::npos) return true;
  return false;
}

TEST(Kubectl, IsAvailable) {
  std::string why = KubectlMissing();
  if (!why.empty()) GTEST_SKIP() << why;
}

TEST(Kubectl, AppliesEscapedAnnotationPointer) {
  if (std::string why = KubectlMissing(); !why.empty()) GTEST_SKIP() << why;
  json pod = {{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", {{"name", "p"}, {"annotations", json::object()}}}};
  json patch = json::parse(R"([{"op": "add", "path": "/metadata/annotations/gpusnap.io~1a~0b", "value": "x"}])");
  json out = ApplyPatch(pod, patch);
  EXPECT_EQ(out["metadata"]["annotations"]["gpusnap.io/a~b"], "x");
}

TEST(Kubectl, RejectsPatchOfMissingPath) {
  if (std::string why = KubectlMissing(); !why.empty()) GTEST_SKIP() << why;
  std::string file = Scratch() + "/bad.json";
  std::ofstream(file) << R"({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}})";
  std::string out;
  int rc = RunCapture({Kubectl(), "patch", "--local", "--type=json", "-f", file, "-p",
                R"([{"op": "replace", "path": "/spec/containers/0/env", "value": []}])", "-o", "json"},
               out);
  EXPECT_NE(rc, 0) << "the cross-check would not catch a bad patch: " << out;
}

}  // namespace gpusnap::k8s::testing
