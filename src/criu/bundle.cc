#include "criu/bundle.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "util/fd.h"
#include "util/files.h"

#ifndef GPUSNAP_INSTALLED_CRIU_BUNDLE
#define GPUSNAP_INSTALLED_CRIU_BUNDLE "/usr/local/lib/gpusnap/criu-bundle"
#endif

namespace gpusnap::criu {

std::vector<std::string> Bundle::Argv(const std::vector<std::string>& args) const {
  std::vector<std::string> argv{loader, criu};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

static Result<Bundle> BundleAt(const std::string& path) {
  Bundle b;
  b.dir = std::filesystem::absolute(path).lexically_normal().string();
  if (!b.dir.empty() && b.dir.back() == '/') b.dir.pop_back();
  b.loader = b.dir + "/lib/ld-linux-x86-64.so.2";
  b.criu = b.dir + "/bin/criu";
  if (::access(b.criu.c_str(), X_OK) != 0 || ::access(b.loader.c_str(), X_OK) != 0)
    return Status::Error(Code::kNotFound, "`{}` is not a CRIU bundle (no bin/criu or lib/ld-linux-x86-64.so.2)", b.dir);
  auto version = ReadFile(b.dir + "/VERSION");
  b.version_line = version.ok() ? version.value() : "unknown";
  while (!b.version_line.empty() && (b.version_line.back() == '\n' || b.version_line.back() == ' '))
    b.version_line.pop_back();
  return b;
}

Result<Bundle> FindBundle(const std::string& configured) {
  // An explicit choice that is wrong is an error, not a reason to look elsewhere.
  for (auto [value, label] : {std::pair<const char*, const char*>{configured.c_str(), "--criu"},
                              {std::getenv("GPUSNAP_CRIU"), "GPUSNAP_CRIU"}}) {
    if (value == nullptr || *value == 0) continue;
    auto b = BundleAt(value);
    if (!b.ok()) return b.status().Wrap(label);
    return b;
  }
  std::vector<std::string> tried;
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    std::string next_to_binary = (exe.parent_path() / "criu-bundle").string();
    if (auto b = BundleAt(next_to_binary); b.ok()) return b;
    tried.push_back(next_to_binary);
  }
  if (auto b = BundleAt(GPUSNAP_INSTALLED_CRIU_BUNDLE); b.ok()) return b;
  tried.push_back(GPUSNAP_INSTALLED_CRIU_BUNDLE);
  std::string where;
  for (const auto& t : tried) where += (where.empty() ? "" : ", ") + t;
  return Status::Error(Code::kNotFound,
                       "no CRIU bundle found (looked at --criu, $GPUSNAP_CRIU, {}); build one with "
                       "scripts/build-criu-bundle.sh",
                       where);
}

Result<Captured> RunCaptured(const std::vector<std::string>& argv, int timeout_ms) {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return Status::Errno(errno, "pipe");
  UniqueFd rd(pipefd[0]), wr(pipefd[1]);
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) return Status::Errno(errno, "fork");
  if (pid == 0) {
    ::dup2(wr.get(), 1);
    ::dup2(wr.get(), 2);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::execv(cargv[0], cargv.data());
    _exit(127);
  }
  wr.Reset();
  Captured out;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
    if (left <= 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      return Status::Error(Code::kTimeout, "`{}` did not finish within {} ms", argv.size() > 1 ? argv[1] : argv[0], timeout_ms);
    }
    pollfd p{rd.get(), POLLIN, 0};
    int r = ::poll(&p, 1, left);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char buf[4096];
    ssize_t n = ::read(rd.get(), buf, sizeof buf);
    if (n <= 0) break;
    out.output.append(buf, static_cast<size_t>(n));
  }
  int wstatus = 0;
  ::waitpid(pid, &wstatus, 0);
  out.exit_status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
  return out;
}

Result<Features> DetectFeatures(const Bundle& bundle, bool need_network_lock) {
  Features f;
  GPUSNAP_ASSIGN_OR_RETURN(auto version, RunCaptured(bundle.Argv({"--version"}), 10000));
  // "Version: 4.3" (possibly followed by "GitID: ...").
  auto pos = version.output.find("Version:");
  if (version.exit_status != 0 || pos == std::string::npos ||
      std::sscanf(version.output.c_str() + pos, "Version: %d.%d", &f.version_major, &f.version_minor) != 2)
    return Status::Error(Code::kExternal, "`criu --version` from `{}` failed: {}", bundle.dir, version.output);
  if (need_network_lock) {
    auto nft = RunCaptured(bundle.Argv({"check", "--feature", "network_lock_nftables"}), 10000);
    f.nftables = nft.ok() && nft->exit_status == 0;
  }
  return f;
}

}  // namespace gpusnap::criu
