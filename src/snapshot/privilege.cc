#include "snapshot/privilege.h"

#include <linux/capability.h>
#include <sys/capability.h>

#include <algorithm>
#include <cctype>
#include <set>

namespace gpusnap {

namespace {

bool Holds(uint64_t set, int cap) { return (set >> cap & 1) != 0; }

// "CAP_SYS_ADMIN", by libcap's table (a number it does not know as itself).
std::string CapName(int cap) {
  char* name = cap_to_name(static_cast<cap_value_t>(cap));
  std::string out = name ? name : std::to_string(cap);
  cap_free(name);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::toupper(c); });
  return out;
}

std::string CapNames(uint64_t caps) {
  std::string out;
  for (int cap = 0; cap < 64; ++cap)
    if (Holds(caps, cap)) out += (out.empty() ? "" : ", ") + CapName(cap);
  return out;
}

template <typename Id>
std::string Ids(const std::set<Id>& ids) {
  std::string out;
  for (Id id : ids) out += (out.empty() ? "" : ", ") + std::to_string(id);
  return out;
}

// "a, b and c".
std::string Listed(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i)
    out += (i == 0 ? "" : i + 1 == items.size() ? " and " : ", ") + items[i];
  return out;
}

// The ids of `task` that are not among `allowed`, when `can_switch` is false.
template <typename Id>
std::set<Id> Foreign(std::initializer_list<Id> task, std::initializer_list<Id> allowed, bool can_switch) {
  std::set<Id> out;
  if (can_switch) return out;
  for (Id id : task)
    if (std::find(allowed.begin(), allowed.end(), id) == allowed.end()) out.insert(id);
  return out;
}

}  // namespace

std::vector<std::string> PrivilegeBeyond(const proc::Credentials& task, const proc::Credentials& init) {
  std::vector<std::string> out;
  bool setuid = Holds(init.cap_permitted, CAP_SETUID), setgid = Holds(init.cap_permitted, CAP_SETGID);

  auto uids = Foreign<uid_t>({task.uid, task.euid, task.suid, task.fsuid},
                             {init.uid, init.euid, init.suid, init.fsuid}, setuid);
  if (!uids.empty())
    out.push_back(fmt::format("runs as uid {} (the placeholder's init: uid {}, without CAP_SETUID)", Ids(uids),
                              init.euid));
  auto gids = Foreign<gid_t>({task.gid, task.egid, task.sgid, task.fsgid},
                             {init.gid, init.egid, init.sgid, init.fsgid}, setgid);
  if (!gids.empty())
    out.push_back(fmt::format("runs as gid {} (the placeholder's init: gid {}, without CAP_SETGID)", Ids(gids),
                              init.egid));
  std::set<gid_t> groups;
  if (!setgid)
    for (gid_t g : task.groups)
      if (std::find(init.groups.begin(), init.groups.end(), g) == init.groups.end() && g != init.gid &&
          g != init.egid && g != init.sgid && g != init.fsgid)
        groups.insert(g);
  if (!groups.empty())
    out.push_back(fmt::format("is in group {}, which the placeholder's init is not (nor holds CAP_SETGID)",
                              Ids(groups)));

  // What a process beside the init could make inheritable: capset's bound.
  uint64_t inheritable = init.cap_inheritable | init.cap_permitted;
  if (Holds(init.cap_permitted, CAP_SETPCAP)) inheritable |= init.cap_bounding;
  struct Set {
    const char* name;
    uint64_t beyond;
  };
  const Set sets[] = {{"permitted", task.cap_permitted & ~init.cap_permitted},
                      {"effective", task.cap_effective & ~init.cap_permitted},
                      {"inheritable", task.cap_inheritable & ~inheritable},
                      {"bounding", task.cap_bounding & ~init.cap_bounding},
                      {"ambient", task.cap_ambient & ~(init.cap_permitted & inheritable)}};
  uint64_t caps = 0;
  std::vector<std::string> in_sets;
  for (const Set& s : sets)
    if (s.beyond != 0) caps |= s.beyond, in_sets.push_back(s.name);
  if (caps != 0)
    out.push_back(fmt::format("holds {} in its {} set{}, which the placeholder's init does not", CapNames(caps),
                              Listed(in_sets), in_sets.size() > 1 ? "s" : ""));

  if (init.no_new_privs && !task.no_new_privs)
    out.push_back("runs without no_new_privs, which the placeholder's init has");

  using proc::SeccompMode;
  if (init.seccomp_mode == SeccompMode::kStrict && task.seccomp_mode != SeccompMode::kStrict) {
    out.push_back("runs outside seccomp strict mode, which binds the placeholder's init");
  } else if (init.seccomp_mode == SeccompMode::kFilter && task.seccomp_mode == SeccompMode::kDisabled) {
    out.push_back("runs without seccomp, whose filters bind the placeholder's init");
  } else if (init.seccomp_mode == SeccompMode::kFilter && task.seccomp_mode == SeccompMode::kFilter) {
    size_t missing = 0;
    for (const std::string& filter : init.seccomp_filters)
      if (std::find(task.seccomp_filters.begin(), task.seccomp_filters.end(), filter) == task.seccomp_filters.end())
        ++missing;
    if (missing > 0)
      out.push_back(fmt::format("is not bound by {} of the {} seccomp filter(s) that bind the placeholder's init",
                                missing, init.seccomp_filters.size()));
  }
  return out;
}

Status CheckWithinPlaceholder(std::string_view lead, std::string_view where, const std::vector<CheckedThread>& threads,
                              const proc::Credentials& init) {
  constexpr size_t kNamed = 3;
  // Threads that hold the same beyond the init, told together, in the order met.
  struct Group {
    std::vector<std::string> findings;
    std::vector<std::string> names;
  };
  std::vector<Group> groups;
  std::vector<std::string> main_findings;  // of the current process's main thread
  for (const CheckedThread& t : threads) {
    std::vector<std::string> findings = PrivilegeBeyond(t.creds, init);
    if (t.tid == t.pid) main_findings = findings;
    if (findings.empty() || (t.tid != t.pid && findings == main_findings)) continue;
    std::string name = t.tid == t.pid ? fmt::format("pid {} ({})", t.pid, t.comm)
                                      : fmt::format("thread {} of pid {} ({})", t.tid, t.pid, t.comm);
    auto group = std::find_if(groups.begin(), groups.end(), [&](const Group& g) { return g.findings == findings; });
    if (group == groups.end()) group = groups.insert(groups.end(), Group{std::move(findings), {}});
    group->names.push_back(std::move(name));
  }
  if (groups.empty()) return Status::Ok();
  std::string text;
  for (const Group& g : groups) {
    std::vector<std::string> names(g.names.begin(), g.names.begin() + std::min(g.names.size(), kNamed));
    if (g.names.size() > kNamed) names.push_back(fmt::format("{} more", g.names.size() - kNamed));
    text += (text.empty() ? "" : "; ") + (g.names.size() == 1 ? fmt::format("{} {} {}", names[0], where, Listed(g.findings))
                                                              : fmt::format("{} {}: each {}", Listed(names), where,
                                                                            Listed(g.findings)));
  }
  return Status::Error(Code::kFailedPrecondition, "{}: {}", lead, text);
}

}  // namespace gpusnap
