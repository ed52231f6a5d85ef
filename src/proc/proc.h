// Facts about processes, read from /proc. Every function is a read; none
// changes a process.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpusnap/status.h"

namespace gpusnap::proc {

struct Stat {
  pid_t pid = 0;
  char state = '?';
  pid_t ppid = 0;
  pid_t session = 0;
  unsigned flags = 0;       // the kernel's PF_* flags of the task
  uint64_t start_time = 0;  // clock ticks since boot: with the pid, identifies a process
};

// kNotFound if the process does not exist (or is gone by the time it is read).
Result<Stat> ReadStat(pid_t pid);
// A task in this state runs again only when someone lets it: 'T', stopped by
// a signal (a group-stop), or 't', stopped by its tracer.
constexpr bool IsStopped(char state) { return state == 'T' || state == 't'; }

// What a thread's /proc/<pid>/task/<tid>/status says of its stop: its state,
// and whether a SIGSTOP waits for it (in its own SigPnd or its process's
// ShdPnd), which stops it as soon as it runs.
struct ThreadStop {
  char state = '?';
  bool stop_pending = false;
  bool held() const { return IsStopped(state) || stop_pending; }
};
// kInvalidArgument for a text without a State line. Pure.
Result<ThreadStop> ParseThreadStop(std::string_view status);

// A thread found held (ThreadStop::held).
struct HeldThread {
  pid_t pid = 0;
  pid_t tid = 0;
  ThreadStop stop;
};
// Every thread of each of `pids` that is held now (stopped, or stopping); a
// process or thread gone meanwhile is not.
std::vector<HeldThread> HeldThreads(const std::vector<pid_t>& pids);

bool Exists(pid_t pid);
// True if `pid` still names the process that started at `start_time`.
bool IsSameProcess(pid_t pid, uint64_t start_time);

// A process held stopped (SIGSTOP) for this object's life, then continued
// (SIGCONT) if it is still the same process. Holds nothing when pid is 0 or
// the process is gone. Not copyable; movable.
class HeldStopped {
 public:
  HeldStopped() = default;
  static HeldStopped Stop(pid_t pid);
  HeldStopped(HeldStopped&& other) noexcept
      : pid_(std::exchange(other.pid_, 0)), start_time_(other.start_time_) {}
  HeldStopped& operator=(HeldStopped&& other) noexcept;
  HeldStopped(const HeldStopped&) = delete;
  HeldStopped& operator=(const HeldStopped&) = delete;
  ~HeldStopped() { Release(); }

  pid_t pid() const { return pid_; }  // 0 when nothing is held
  void Release();                     // continues it now

 private:
  pid_t pid_ = 0;
  uint64_t start_time_ = 0;
};

// Direct children of every thread of `pid`.
std::vector<pid_t> Children(pid_t pid);
// `pid` and all its descendants, parents before children.
std::vector<pid_t> Tree(pid_t pid);
// The tids of every thread of `pid`, ascending; empty when it is gone.
std::vector<pid_t> Threads(pid_t pid);

// The pid in each nested pid namespace, outermost first (/proc/<pid>/status NSpid).
Result<std::vector<pid_t>> NsPids(pid_t pid);

// The host pid of the task that has pid `ns_pid` in its innermost namespace,
// among `root`'s descendants, waiting up to 2 s for it to appear (a task CRIU
// just restored may not be listed yet). kExternal when it does not appear.
Result<pid_t> WaitForNsPid(pid_t root, pid_t ns_pid);
std::vector<std::string> Cmdline(pid_t pid);

// The namespace identity (inode of /proc/<pid>/ns/<kind>), 0 if unreadable.
uint64_t NamespaceId(pid_t pid, const char* kind);

// What each open file descriptor of the process names (the /proc/<pid>/fd
// links: a path, "pipe:[..]", "anon_inode:[..]"), by descriptor; empty if
// the process is gone or unreadable.
std::vector<std::pair<int, std::string>> OpenFiles(pid_t pid);
// The path column of /proc/<pid>/maps, one entry per mapping that names one.
std::vector<std::string> MappedPaths(pid_t pid);

// True if the process maps an NVIDIA device file (/dev/nvidia*): it holds a
// CUDA context.
bool UsesNvidiaGpu(pid_t pid);

// The host tid of a thread of `pid` known by `tid`, which may be its host tid
// or its tid inside the process's pid namespace (what a program there sees,
// and what the CUDA driver reports). kNotFound if no thread matches.
Result<pid_t> HostTid(pid_t pid, pid_t tid);

}  // namespace gpusnap::proc
