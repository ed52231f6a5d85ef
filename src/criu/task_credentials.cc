#include "criu/task_credentials.h"

#include <unistd.h>

#include <optional>

#include "criu/image_reader.h"

namespace gpusnap::criu {

namespace {

// criu/include/magic.h.
constexpr uint32_t kPstreeMagic = 0x50273030;
constexpr uint32_t kCoreMagic = 0x55053847;
constexpr uint32_t kSeccompMagic = 0x64413049;

// images/pstree.proto pstree_entry: pid, threads.
constexpr int kPstreePid = 1;
constexpr int kPstreeThreads = 5;
// images/core.proto core_entry: tc (task_core_entry), thread_core.
constexpr int kCoreTc = 3;
constexpr int kCoreThreadCore = 5;
// task_core_entry: task_state (compel's TASK_DEAD = 2: a zombie), comm, and
// the seccomp fields older dumps kept per process.
constexpr int kTcTaskState = 1;
constexpr int kTcComm = 6;
constexpr int kTcOldSeccompMode = 11;
constexpr int kTcOldSeccompFilter = 12;
constexpr uint64_t kTaskDead = 2;
// thread_core_entry: creds, seccomp_mode, seccomp_filter (an index into
// seccomp.img's filters), comm.
constexpr int kThreadCreds = 10;
constexpr int kThreadSeccompMode = 11;
constexpr int kThreadSeccompFilter = 12;
constexpr int kThreadComm = 13;
// images/creds.proto creds_entry.
constexpr int kCredsUid = 1, kCredsGid = 2, kCredsEuid = 3, kCredsEgid = 4, kCredsSuid = 5, kCredsSgid = 6,
              kCredsFsuid = 7, kCredsFsgid = 8;
constexpr int kCredsCapInh = 9, kCredsCapPrm = 10, kCredsCapEff = 11, kCredsCapBnd = 12, kCredsCapAmb = 19;
constexpr int kCredsGroups = 14;
constexpr int kCredsNoNewPrivs = 18;
// images/seccomp.proto seccomp_entry: seccomp_filters; seccomp_filter:
// filter (a struct sock_filter array), prev (the next older filter's
// index), flags (SECCOMP_FILTER_FLAG_TSYNC = 1).
constexpr int kSeccompFilters = 1;
constexpr int kFilterProgram = 1;
constexpr int kFilterPrev = 2;
constexpr int kFilterFlags = 3;
constexpr uint64_t kFilterFlagTsync = 1;
constexpr size_t kSockFilterSize = 8;

struct Filter {
  std::string program;
  std::optional<uint64_t> prev;
  uint64_t flags = 0;
};

Status Corrupt(const std::string& path, const std::string& why) {
  return Status::Error(Code::kCorruption, "CRIU image `{}`: {}", path, why);
}

// seccomp.img's filters; none when the dump has no such image.
Result<std::vector<Filter>> ReadFilters(const std::string& dir) {
  std::string path = dir + "/seccomp.img";
  std::vector<Filter> out;
  if (::access(path.c_str(), F_OK) != 0) return out;
  GPUSNAP_ASSIGN_OR_RETURN(auto entries, ReadImage(path, kSeccompMagic));
  for (const auto& entry : entries) {
    for (const std::string& wire : entry.AllBytes(kSeccompFilters)) {
      auto f = ParseImageMessage(wire);
      auto program = f ? f->Bytes(kFilterProgram) : std::nullopt;
      if (!program || program->size() % kSockFilterSize != 0)
        return Corrupt(path, fmt::format("filter {} is not a BPF program", out.size()));
      out.push_back({*program, f->Varint(kFilterPrev), f->Varint(kFilterFlags).value_or(0)});
    }
  }
  return out;
}

// A chain from its newest filter, `newest`, through each `prev`.
Result<std::vector<const Filter*>> Chain(const std::vector<Filter>& filters, uint64_t newest, const std::string& path) {
  std::vector<const Filter*> chain;
  for (std::optional<uint64_t> at = newest; at; at = filters[*at].prev) {
    if (*at >= filters.size() || chain.size() == filters.size())
      return Corrupt(path, fmt::format("a seccomp filter index {} out of the {} filters of seccomp.img", *at,
                                       filters.size()));
    chain.push_back(&filters[*at]);
  }
  return chain;
}

Result<proc::Credentials> ReadCreds(const ImageMessage& wire, const std::string& path) {
  proc::Credentials c;
  auto id = [&](int number, auto& out) -> bool {
    auto v = wire.Varint(number);
    if (v) out = static_cast<std::remove_reference_t<decltype(out)>>(*v);
    return v.has_value();
  };
  if (!id(kCredsUid, c.uid) || !id(kCredsGid, c.gid) || !id(kCredsEuid, c.euid) || !id(kCredsEgid, c.egid) ||
      !id(kCredsSuid, c.suid) || !id(kCredsSgid, c.sgid) || !id(kCredsFsuid, c.fsuid) || !id(kCredsFsgid, c.fsgid))
    return Corrupt(path, "its credentials lack a uid or gid");
  // Each set is an array of 32-bit words, the lowest capabilities first.
  auto caps = [&](int number, uint64_t& out) -> bool {
    auto words = wire.Varints(number);
    if (!words || words->size() > 2) return false;
    out = 0;
    for (size_t i = 0; i < words->size(); ++i) out |= ((*words)[i] & 0xffffffffu) << (32 * i);
    return true;
  };
  if (!caps(kCredsCapInh, c.cap_inheritable) || !caps(kCredsCapPrm, c.cap_permitted) ||
      !caps(kCredsCapEff, c.cap_effective) || !caps(kCredsCapBnd, c.cap_bounding) ||
      !caps(kCredsCapAmb, c.cap_ambient))
    return Corrupt(path, "a capability set of its credentials is malformed");
  auto groups = wire.Varints(kCredsGroups);
  if (!groups) return Corrupt(path, "the groups of its credentials are malformed");
  for (uint64_t g : *groups) c.groups.push_back(static_cast<gid_t>(g));
  c.no_new_privs = wire.Varint(kCredsNoNewPrivs).value_or(0) != 0;
  return c;
}

// A thread as its core image has it; `synced`: its filters carry TSYNC.
struct ThreadImage {
  DumpedThread thread;
  bool synced = false;
};

// One thread's core image: nullopt for a zombie.
Result<std::optional<ThreadImage>> ReadThread(const std::string& dir, pid_t pid, pid_t tid,
                                               const std::vector<Filter>& filters) {
  std::string path = fmt::format("{}/core-{}.img", dir, tid);
  GPUSNAP_ASSIGN_OR_RETURN(auto entries, ReadImage(path, kCoreMagic));
  if (entries.empty()) return Corrupt(path, "it holds no entry");
  const ImageMessage& core = entries.front();
  std::optional<ImageMessage> tc, thread;
  if (auto b = core.Bytes(kCoreTc)) tc = ParseImageMessage(*b);
  if (auto b = core.Bytes(kCoreThreadCore)) thread = ParseImageMessage(*b);
  if (tc && tc->Varint(kTcTaskState) == kTaskDead) return std::optional<ThreadImage>();
  auto creds_wire = thread ? thread->Bytes(kThreadCreds) : std::nullopt;
  auto creds_message = creds_wire ? ParseImageMessage(*creds_wire) : std::nullopt;
  if (!creds_message) return Corrupt(path, "it holds no credentials");
  ThreadImage image{.thread = {.pid = pid, .tid = tid, .comm = "", .creds = {}}, .synced = false};
  DumpedThread& out = image.thread;
  GPUSNAP_ASSIGN_OR_RETURN(out.creds, ReadCreds(*creds_message, path));
  out.comm = thread->Bytes(kThreadComm).value_or(tc ? tc->Bytes(kTcComm).value_or("") : "");
  // The thread's own seccomp fields, else those older dumps kept per process.
  std::optional<uint64_t> mode = thread->Varint(kThreadSeccompMode), newest = thread->Varint(kThreadSeccompFilter);
  if (!mode && tc) mode = tc->Varint(kTcOldSeccompMode), newest = tc->Varint(kTcOldSeccompFilter);
  if (mode.value_or(0) > 2) return Corrupt(path, fmt::format("seccomp mode {}", *mode));
  out.creds.seccomp_mode = static_cast<proc::SeccompMode>(mode.value_or(0));
  if (out.creds.seccomp_mode == proc::SeccompMode::kFilter) {
    if (!newest) return Corrupt(path, "seccomp mode filter without a filter");
    GPUSNAP_ASSIGN_OR_RETURN(auto chain, Chain(filters, *newest, dir + "/seccomp.img"));
    for (const Filter* f : chain) {
      out.creds.seccomp_filters.push_back(f->program);
      image.synced = image.synced || (f->flags & kFilterFlagTsync) != 0;
    }
  }
  return std::optional<ThreadImage>(std::move(image));
}

}  // namespace

Result<std::vector<DumpedThread>> ReadDumpedCredentials(const std::string& images_dir) {
  std::string pstree = images_dir + "/pstree.img";
  GPUSNAP_ASSIGN_OR_RETURN(auto processes, ReadImage(pstree, kPstreeMagic));
  GPUSNAP_ASSIGN_OR_RETURN(auto filters, ReadFilters(images_dir));
  std::vector<DumpedThread> out;
  for (const auto& process : processes) {
    auto pid = process.Varint(kPstreePid);
    auto threads = process.Varints(kPstreeThreads);
    if (!pid || !threads) return Corrupt(pstree, "a process without a pid or with malformed threads");
    // The main thread first: the others may take its synced filters.
    std::vector<pid_t> tids{static_cast<pid_t>(*pid)};
    for (uint64_t t : *threads)
      if (static_cast<pid_t>(t) != tids.front()) tids.push_back(static_cast<pid_t>(t));
    std::optional<ThreadImage> main;
    for (pid_t tid : tids) {
      GPUSNAP_ASSIGN_OR_RETURN(auto image, ReadThread(images_dir, tids.front(), tid, filters));
      if (!image) break;  // a zombie
      proc::Credentials& creds = image->thread.creds;
      if (tid == tids.front()) {
        main = image;
      } else if (creds.seccomp_mode == proc::SeccompMode::kDisabled && main->synced) {
        creds.seccomp_mode = main->thread.creds.seccomp_mode;
        creds.seccomp_filters = main->thread.creds.seccomp_filters;
      }
      out.push_back(std::move(image->thread));
    }
  }
  return out;
}

}  // namespace gpusnap::criu
