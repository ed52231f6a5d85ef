#include "proc/credentials.h"

#include <charconv>

#include "util/files.h"

namespace gpusnap::proc {

namespace {

// The whitespace-separated numbers of a status value, in `base`; false when
// one is not a number.
template <typename T>
bool Numbers(std::string_view value, int base, std::vector<T>& out) {
  out.clear();
  while (!value.empty()) {
    size_t skip = value.find_first_not_of(" \t");
    if (skip == std::string_view::npos) break;
    value.remove_prefix(skip);
    uint64_t v = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v, base);
    if (ec != std::errc() || end == value.data()) return false;
    out.push_back(static_cast<T>(v));
    value.remove_prefix(static_cast<size_t>(end - value.data()));
  }
  return true;
}

}  // namespace

Result<Credentials> ParseStatusCredentials(std::string_view status, std::string_view where) {
  Credentials c;
  bool uid = false, gid = false, bnd = false;
  std::vector<uint64_t> n;
  for (std::string_view rest = status; !rest.empty();) {
    size_t end = rest.find('\n');
    std::string_view line = rest.substr(0, end);
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string_view key = line.substr(0, colon), value = line.substr(colon + 1);
    bool hex = key.starts_with("Cap");
    if (!Numbers(value, hex ? 16 : 10, n)) continue;
    if (key == "Uid" && n.size() == 4) {
      c.uid = static_cast<uid_t>(n[0]), c.euid = static_cast<uid_t>(n[1]);
      c.suid = static_cast<uid_t>(n[2]), c.fsuid = static_cast<uid_t>(n[3]);
      uid = true;
    } else if (key == "Gid" && n.size() == 4) {
      c.gid = static_cast<gid_t>(n[0]), c.egid = static_cast<gid_t>(n[1]);
      c.sgid = static_cast<gid_t>(n[2]), c.fsgid = static_cast<gid_t>(n[3]);
      gid = true;
    } else if (key == "Groups") {
      c.groups.assign(n.begin(), n.end());
    } else if (n.size() == 1) {
      if (key == "CapInh") c.cap_inheritable = n[0];
      else if (key == "CapPrm") c.cap_permitted = n[0];
      else if (key == "CapEff") c.cap_effective = n[0];
      else if (key == "CapBnd") c.cap_bounding = n[0], bnd = true;
      else if (key == "CapAmb") c.cap_ambient = n[0];
      else if (key == "NoNewPrivs") c.no_new_privs = n[0] != 0;
      else if (key == "Seccomp" && n[0] <= 2) c.seccomp_mode = static_cast<SeccompMode>(n[0]);
    }
  }
  if (!uid || !gid || !bnd) return Status::Error(Code::kInternal, "`{}` names no Uid, Gid and CapBnd", where);
  return c;
}

Result<Credentials> ReadTaskCredentials(pid_t pid, pid_t tid) {
  std::string path = "/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/status";
  auto text = ReadFile(path);
  if (!text.ok()) return Status::Error(Code::kNotFound, "no task {} of pid {}", tid, pid);
  return ParseStatusCredentials(*text, path);
}

}  // namespace gpusnap::proc
