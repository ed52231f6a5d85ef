#include "proc/proc.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <deque>
#include <filesystem>
#include <sstream>
#include <thread>

#include "util/files.h"

namespace gpusnap::proc {

static std::string PidPath(pid_t pid, const char* leaf) { return "/proc/" + std::to_string(pid) + "/" + leaf; }

Result<Stat> ReadStat(pid_t pid) {
  if (pid <= 0) return Status::Error(Code::kInvalidArgument, "invalid pid {}", pid);
  auto text = ReadFile(PidPath(pid, "stat"));
  if (!text.ok()) return Status::Error(Code::kNotFound, "no process with pid {}", pid);
  // The command name is in parentheses and may itself contain ") ".
  auto close = text->rfind(')');
  if (close == std::string::npos) return Status::Error(Code::kInternal, "unreadable /proc/{}/stat", pid);
  std::istringstream in(text->substr(close + 2));
  Stat s;
  s.pid = pid;
  int pgrp = 0, tty = 0, tpgid = 0;
  uint64_t skip = 0;
  in >> s.state >> s.ppid >> pgrp >> s.session >> tty >> tpgid >> s.flags;
  for (int i = 0; i < 11; ++i) in >> skip;  // minflt .. priority/nice fields 10-20
  in >> s.start_time;
  if (!in) return Status::Error(Code::kInternal, "unreadable /proc/{}/stat", pid);
  return s;
}

Result<ThreadStop> ParseThreadStop(std::string_view status) {
  ThreadStop stop;
  bool has_state = false;
  // A pending-signal mask is hex, bit N-1 for signal N.
  auto stop_bit = [](std::string_view mask) {
    uint64_t bits = 0;
    auto digits = mask.substr(std::min(mask.find_first_not_of(" \t"), mask.size()));
    std::from_chars(digits.data(), digits.data() + digits.size(), bits, 16);
    return (bits >> (SIGSTOP - 1)) & 1;
  };
  while (!status.empty()) {
    size_t end = std::min(status.find('\n'), status.size());
    std::string_view line = status.substr(0, end);
    status.remove_prefix(std::min(end + 1, status.size()));
    if (line.starts_with("State:")) {
      size_t at = line.find_first_not_of(" \t", 6);
      if (at != std::string_view::npos) {
        stop.state = line[at];
        has_state = true;
      }
    } else if (line.starts_with("SigPnd:") || line.starts_with("ShdPnd:")) {
      stop.stop_pending = stop.stop_pending || stop_bit(line.substr(7));
    }
  }
  if (!has_state) return Status::Error(Code::kInvalidArgument, "no State line in a task's status");
  return stop;
}

std::vector<HeldThread> HeldThreads(const std::vector<pid_t>& pids) {
  std::vector<HeldThread> out;
  for (pid_t pid : pids) {
    std::error_code ec;
    for (const auto& task : std::filesystem::directory_iterator(PidPath(pid, "task"), ec)) {
      auto text = ReadFile(task.path().string() + "/status");
      if (!text.ok()) continue;  // gone meanwhile
      auto stop = ParseThreadStop(*text);
      if (stop.ok() && stop->held()) out.push_back({pid, std::atoi(task.path().filename().c_str()), *stop});
    }
  }
  return out;
}

bool Exists(pid_t pid) { return pid > 0 && ReadStat(pid).ok(); }

bool IsSameProcess(pid_t pid, uint64_t start_time) {
  auto s = ReadStat(pid);
  return s.ok() && s->start_time == start_time && s->state != 'Z' && s->state != 'X';
}

std::vector<pid_t> Children(pid_t pid) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator(PidPath(pid, "task"), ec)) {
    auto text = ReadFile(task.path().string() + "/children");
    if (!text.ok()) continue;
    std::istringstream in(*text);
    pid_t child;
    while (in >> child) out.push_back(child);
  }
  return out;
}

std::vector<pid_t> Tree(pid_t pid) {
  std::vector<pid_t> out;
  std::deque<pid_t> todo{pid};
  while (!todo.empty()) {
    pid_t p = todo.front();
    todo.pop_front();
    out.push_back(p);
    for (pid_t c : Children(p)) todo.push_back(c);
  }
  return out;
}

std::vector<pid_t> Threads(pid_t pid) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(PidPath(pid, "task"), ec))
    out.push_back(std::atoi(e.path().filename().c_str()));
  std::sort(out.begin(), out.end());
  return out;
}

Result<std::vector<pid_t>> NsPids(pid_t pid) {
  auto text = ReadFile(PidPath(pid, "status"));
  if (!text.ok()) return Status::Error(Code::kNotFound, "no process with pid {}", pid);
  auto pos = text->find("\nNSpid:");
  if (pos == std::string::npos) return Status::Error(Code::kNotSupported, "kernel has no NSpid in /proc/{}/status", pid);
  std::istringstream in(text->substr(pos + 7, text->find('\n', pos + 1) - pos - 7));
  std::vector<pid_t> out;
  pid_t p;
  while (in >> p) out.push_back(p);
  return out;
}

std::vector<std::string> Cmdline(pid_t pid) {
  std::vector<std::string> out;
  auto text = ReadFile(PidPath(pid, "cmdline"));
  if (!text.ok()) return out;
  std::string cur;
  for (char c : *text) {
    if (c == '\0') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

uint64_t NamespaceId(pid_t pid, const char* kind) {
  struct stat st{};
  std::string path = "/proc/" + std::to_string(pid) + "/ns/" + kind;
  if (::stat(path.c_str(), &st) != 0) return 0;
  return st.st_ino;
}

std::vector<std::pair<int, std::string>> OpenFiles(pid_t pid) {
  std::vector<std::pair<int, std::string>> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(PidPath(pid, "fd"), ec)) {
    std::error_code link_ec;
    auto target = std::filesystem::read_symlink(e.path(), link_ec);
    if (!link_ec) out.emplace_back(std::atoi(e.path().filename().c_str()), target.string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> MappedPaths(pid_t pid) {
  std::vector<std::string> out;
  auto maps = ReadFile(PidPath(pid, "maps"));
  if (!maps.ok()) return out;
  std::istringstream in(*maps);
  std::string line;
  while (std::getline(in, line)) {
    // address perms offset dev inode [path]: the path starts after five fields.
    std::istringstream fields(line);
    std::string skip;
    for (int i = 0; i < 5; ++i) fields >> skip;
    std::string path;
    std::getline(fields >> std::ws, path);
    if (!path.empty()) out.push_back(path);
  }
  return out;
}

bool UsesNvidiaGpu(pid_t pid) {
  auto maps = ReadFile("/proc/" + std::to_string(pid) + "/maps");
  return maps.ok() && maps->find(" /dev/nvidia") != std::string::npos;
}

Result<pid_t> HostTid(pid_t pid, pid_t tid) {
  std::string task = "/proc/" + std::to_string(pid) + "/task/";
  if (::access((task + std::to_string(tid)).c_str(), F_OK) == 0) return tid;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(task, ec)) {
    pid_t host = std::atoi(e.path().filename().c_str());
    auto nspids = NsPids(host);  // /proc/<tid> serves a thread as /proc/<pid> serves a process
    if (nspids.ok() && !nspids->empty() && nspids->back() == tid) return host;
  }
  return Status::Error(Code::kNotFound, "pid {} has no thread {}", pid, tid);
}
Result<pid_t> WaitForNsPid(pid_t root, pid_t ns_pid) {
  for (int tries = 0; tries < 400; ++tries) {
    for (pid_t c : Tree(root)) {
      auto nspids = NsPids(c);
      if (nspids.ok() && !nspids->empty() && nspids->back() == ns_pid) return c;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return Status::Error(Code::kExternal, "the restored task (pid {} in its namespace) did not appear", ns_pid);
}

}  // namespace gpusnap::proc

namespace gpusnap::proc {

HeldStopped HeldStopped::Stop(pid_t pid) {
  HeldStopped held;
  if (pid <= 0) return held;
  auto st = ReadStat(pid);
  if (!st.ok() || ::kill(pid, SIGSTOP) != 0) return held;
  held.pid_ = pid;
  held.start_time_ = st->start_time;
  return held;
}

HeldStopped& HeldStopped::operator=(HeldStopped&& other) noexcept {
  if (this != &other) {
    Release();
    pid_ = std::exchange(other.pid_, 0);
    start_time_ = other.start_time_;
  }
  return *this;
}

void HeldStopped::Release() {
  if (pid_ > 0 && IsSameProcess(pid_, start_time_)) ::kill(pid_, SIGCONT);
  pid_ = 0;
}

}  // namespace gpusnap::proc
