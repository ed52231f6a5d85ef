#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "gpusnap/snapshot.h"
#include "store/kube_names.h"
#include "store/layout.h"
#include "store/meta_digest.h"

namespace gpusnap {

using nlohmann::json;

namespace {

bool IsLowerHex(std::string_view s, size_t n) {
  if (s.size() != n) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

bool IsDigits(std::string_view s, size_t min, size_t max) {
  if (s.size() < min || s.size() > max) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// Schema (MAJOR, MINOR) from "MAJOR.MINOR", digits only.
bool ParseVersion(std::string_view text, int& major, int& minor) {
  auto dot = text.find('.');
  if (dot == std::string_view::npos) return false;
  std::string_view a = text.substr(0, dot), b = text.substr(dot + 1);
  if (!IsDigits(a, 1, 6) || !IsDigits(b, 1, 6)) return false;
  major = std::stoi(std::string(a));
  minor = std::stoi(std::string(b));
  return true;
}

// "2026-11-29T23:30:00.000Z", or with an offset instead of Z (RFC 3339).
bool IsRfc3339(std::string_view s) {
  auto num = [&](size_t at, size_t n, int lo, int hi) {
    if (s.size() < at + n || !IsDigits(s.substr(at, n), n, n)) return false;
    int v = std::stoi(std::string(s.substr(at, n)));
    return v >= lo && v <= hi;
  };
  if (!num(0, 4, 0, 9999) || s[4] != '-' || !num(5, 2, 1, 12) || s[7] != '-' || !num(8, 2, 1, 31) ||
      (s[10] != 'T' && s[10] != 't') || !num(11, 2, 0, 23) || s[13] != ':' || !num(14, 2, 0, 59) || s[16] != ':' ||
      !num(17, 2, 0, 60))
    return false;
  size_t i = 19;
  if (i < s.size() && s[i] == '.') {
    size_t start = ++i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    if (i == start) return false;
  }
  if (i < s.size() && (s[i] == 'Z' || s[i] == 'z')) return i + 1 == s.size();
  return i + 6 == s.size() && (s[i] == '+' || s[i] == '-') && num(i + 1, 2, 0, 23) && s[i + 3] == ':' &&
         num(i + 4, 2, 0, 59);
}

// "GPU-" + 8-4-4-4-12 hex digits, as cuda::FormatUuid writes it (any case).
bool IsGpuUuid(std::string_view s) {
  static constexpr std::string_view kShape = "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";
  if (s.size() != kShape.size()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (kShape[i] != 'x') {
      if (c != kShape[i]) return false;
    } else if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) {
      return false;
    }
  }
  return true;
}

// A path inside the snapshot: relative, every component a plain name, and
// none of the files the digests leave out.
bool IsSafeFilePath(std::string_view path) {
  if (path.empty() || path.front() == '/' || path.back() == '/') return false;
  for (char c : path)
    if (static_cast<unsigned char>(c) < 0x20) return false;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    std::string_view part = path.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return path != SnapshotFiles::kMetaFile && !SnapshotFiles::IsCriuAccountingFile(path);
}

// What a number may be, for messages: "`pids[1]` is -1, not a pid (1..4194304)".
struct Range {
  int64_t lo;
  uint64_t hi;
  const char* what;
};
constexpr Range kPid{1, kPidMaxLimit, "a pid"};
constexpr Range kPort{1, 65535, "a TCP port"};
constexpr Range kBytes{0, std::numeric_limits<uint64_t>::max(), "a byte count"};
constexpr Range kNonNegativeInt{0, std::numeric_limits<int>::max(), "a non-negative int"};

std::string Quote(const json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// Reads the fields of gpusnap.json, checking each one's type and range; keeps
// the first problem, naming the field by its path ("source.host_pid") and
// quoting the value.
class Reader {
 public:
  bool ok() const { return failure_.empty(); }
  const std::string& failure() const { return failure_; }
  void Fail(std::string why) {
    if (failure_.empty()) failure_ = std::move(why);
  }

  // obj[key], or nullptr when it is absent (a failure when `required`).
  const json* Member(const json& obj, const std::string& name, const char* key, bool required) {
    if (!ok()) return nullptr;
    auto it = obj.find(key);
    if (it != obj.end()) return &*it;
    if (required) Fail(fmt::format("missing field `{}`", name));
    return nullptr;
  }
  // The same, for a member that must be of `type`.
  const json* Typed(const json& obj, const std::string& name, const char* key, bool required, json::value_t type,
                    const char* type_name) {
    const json* v = Member(obj, name, key, required);
    if (v == nullptr) return nullptr;
    if (!HasType(*v, type)) {
      WrongType(name, *v, type_name);
      return nullptr;
    }
    return v;
  }

  void String(const json& obj, const std::string& where, const char* key, std::string& out, bool required = true,
              bool nonempty = false) {
    std::string name = Join(where, key);
    if (const json* v = Typed(obj, name, key, required, json::value_t::string, "a string")) {
      out = v->get<std::string>();
      if (nonempty && out.empty()) Fail(fmt::format("field `{}` is empty", name));
    }
  }
  void Bool(const json& obj, const std::string& where, const char* key, bool& out) {
    std::string name = Join(where, key);
    if (const json* v = Typed(obj, name, key, false, json::value_t::boolean, "true or false")) out = v->get<bool>();
  }
  template <typename T>
  void Integer(const json& obj, const std::string& where, const char* key, T& out, Range range, bool required = true) {
    std::string name = Join(where, key);
    if (const json* v = Member(obj, name, key, required)) IntegerValue(*v, name, out, range);
  }
  // Calls `item` on each element of the array `key`, named "key[i]"; false
  // when the array is absent (or not one).
  template <typename Item>
  bool Array(const json& obj, const std::string& where, const char* key, bool required, Item item) {
    std::string name = Join(where, key);
    const json* v = Typed(obj, name, key, required, json::value_t::array, "an array");
    if (v == nullptr) return false;
    for (size_t i = 0; i < v->size() && ok(); ++i) item((*v)[i], fmt::format("{}[{}]", name, i));
    return true;
  }
  template <typename T>
  void IntegerArray(const json& obj, const std::string& where, const char* key, std::vector<T>& out, Range range,
                    bool required = true) {
    std::vector<T> items;
    if (Array(obj, where, key, required, [&](const json& v, const std::string& name) {
          T x{};
          IntegerValue(v, name, x, range);
          items.push_back(x);
        }))
      out = std::move(items);
  }
  void StringArray(const json& obj, const std::string& where, const char* key, std::vector<std::string>& out,
                   bool required = true) {
    std::vector<std::string> items;
    if (Array(obj, where, key, required, [&](const json& v, const std::string& name) {
          if (!v.is_string()) WrongType(name, v, "a string");
          else items.push_back(v.get<std::string>());
        }))
      out = std::move(items);
  }
  const json* Object(const json& obj, const std::string& where, const char* key, bool required = true) {
    return Typed(obj, Join(where, key), key, required, json::value_t::object, "an object");
  }

  template <typename T>
  void IntegerValue(const json& v, const std::string& name, T& out, Range range) {
    if (!ok()) return;
    if (!v.is_number_integer()) return WrongType(name, v, "an integer");
    bool in_range;
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      in_range = u <= range.hi && (range.lo <= 0 || u >= static_cast<uint64_t>(range.lo));
    } else {
      int64_t i = v.get<int64_t>();
      in_range = i >= range.lo && (i < 0 || static_cast<uint64_t>(i) <= range.hi);
    }
    if (!in_range) {
      if (range.hi == std::numeric_limits<uint64_t>::max())
        return Fail(fmt::format("field `{}` is {}, not {} (>= {})", name, Quote(v), range.what, range.lo));
      return Fail(fmt::format("field `{}` is {}, not {} ({}..{})", name, Quote(v), range.what, range.lo, range.hi));
    }
    out = v.get<T>();
  }

  static std::string Join(const std::string& where, const char* key) {
    return where.empty() ? std::string(key) : where + "." + key;
  }

 private:
  static bool HasType(const json& v, json::value_t type) {
    return type == json::value_t::string    ? v.is_string()
           : type == json::value_t::boolean ? v.is_boolean()
           : type == json::value_t::array   ? v.is_array()
           : type == json::value_t::object  ? v.is_object()
                                            : false;
  }
  void WrongType(const std::string& name, const json& v, const char* expected) {
    Fail(fmt::format("field `{}` is {} ({}), not {}", name, v.type_name(), Quote(v), expected));
  }

  std::string failure_;
};

// Fields added by a minor version are required in snapshots of that version
// on; older ones get the documented default.
bool Since(const SnapshotMeta& m, int minor) { return m.schema_minor >= minor; }

void RequireSince(Reader& r, const SnapshotMeta& m, int minor, const json& obj, const char* key, const char* name) {
  if (r.ok() && Since(m, minor) && !obj.contains(key))
    r.Fail(fmt::format("missing field `{}` (required since schema {}.{})", name, kSchemaMajor, minor));
}

void ReadSource(Reader& r, const json& j, SnapshotMeta& m) {
  const json* s = r.Object(j, "", "source");
  if (s == nullptr) return;
  r.String(*s, "source", "kind", m.source.kind);
  if (r.ok() && m.source.kind != "workload" && m.source.kind != "pid")
    r.Fail(fmt::format("field `source.kind` is \"{}\", not \"workload\" or \"pid\"", m.source.kind));
  r.String(*s, "source", "name", m.source.name, /*required=*/false);
  if (r.ok() && m.source.kind == "workload" && m.source.name.empty())
    r.Fail("field `source.name` is missing or empty, but source.kind is \"workload\"");
  r.Integer(*s, "source", "host_pid", m.source.host_pid, kPid);
  r.Integer(*s, "source", "ns_pid", m.source.ns_pid, kPid);
  r.StringArray(*s, "source", "cmdline", m.source.cmdline, false);
  r.String(*s, "source", "log", m.source.log, false);
}

void ReadCriu(Reader& r, const json& j, SnapshotMeta& m) {
  const json* c = r.Object(j, "", "criu");
  if (c == nullptr) return;
  r.String(*c, "criu", "version", m.criu_version, true, /*nonempty=*/true);
  r.Bool(*c, "criu", "tcp_established", m.tcp_established);
  r.Bool(*c, "criu", "shell_job", m.shell_job);  // written since 1.3, not always: default false
  RequireSince(r, m, 4, *c, "listen_ports", "criu.listen_ports");
  r.IntegerArray(*c, "criu", "listen_ports", m.listen_ports, kPort, false);
}

void ReadFiles(Reader& r, const json& j, SnapshotMeta& m) {
  const json* files = r.Object(j, "", "files");
  if (files == nullptr) return;
  for (const auto& [path, d] : files->items()) {
    if (!r.ok()) return;
    std::string name = fmt::format("files[\"{}\"]", path);
    if (!IsSafeFilePath(path)) return r.Fail(fmt::format("files has an unsafe path `{}`", path));
    if (!d.is_object()) return r.Fail(fmt::format("field `{}` is {}, not an object", name, d.type_name()));
    FileDigest fd;
    r.Integer(d, name, "size", fd.size, kBytes);
    r.String(d, name, "sha256", fd.sha256);
    if (r.ok() && !IsLowerHex(fd.sha256, 64))
      r.Fail(fmt::format("field `{}.sha256` is \"{}\", not 64 lower-case hex digits", name, fd.sha256));
    m.files[path] = fd;
  }
}

void ReadTimings(Reader& r, const json& j, SnapshotMeta& m) {
  const json* t = r.Object(j, "", "timings_s", false);
  if (t == nullptr) return;
  for (const auto& [phase, v] : t->items()) {
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
      return r.Fail(fmt::format("field `timings_s.{}` is {}, not a number of seconds (>= 0)", phase, Quote(v)));
    m.timings_s[phase] = v.get<double>();
  }
}

void ReadGpu(Reader& r, const json& j, SnapshotMeta& m) {
  const json* g = r.Object(j, "", "gpu", false);
  if (g == nullptr) return;
  SnapshotGpuState gs;
  r.String(*g, "gpu", "driver_version", gs.driver_version, true, /*nonempty=*/true);
  r.Integer(*g, "gpu", "cuda_version", gs.cuda_version, kNonNegativeInt);
  r.IntegerArray(*g, "gpu", "ns_pids", gs.ns_pids, kPid);
  r.IntegerArray(*g, "gpu", "restore_tids", gs.restore_tids, kPid);
  if (r.ok() && gs.restore_tids.size() != gs.ns_pids.size())
    r.Fail(fmt::format("gpu has {} restore threads for {} GPU processes", gs.restore_tids.size(), gs.ns_pids.size()));
  if (const json* share = r.Object(*g, "gpu", "gpushare", false)) {
    gs.gpushare = true;
    r.String(*share, "gpu.gpushare", "chunk_store", gs.chunk_store, true, /*nonempty=*/true);
    r.StringArray(*share, "gpu.gpushare", "control_sockets", gs.control_sockets);
    r.String(*share, "gpu.gpushare", "shim", gs.shim, false);
    if (r.ok() && gs.control_sockets.size() != gs.ns_pids.size())
      r.Fail(fmt::format("gpu.gpushare has {} control sockets for {} GPU processes", gs.control_sockets.size(),
                         gs.ns_pids.size()));
  }
  if (const json* gpus = r.Typed(*g, "gpu.gpus", "gpus", true, json::value_t::array, "an array")) {
    for (size_t i = 0; i < gpus->size() && r.ok(); ++i) {
      const json& item = (*gpus)[i];
      std::string name = fmt::format("gpu.gpus[{}]", i);
      if (!item.is_object()) return r.Fail(fmt::format("field `{}` is {}, not an object", name, item.type_name()));
      SnapshotGpu sg;
      std::string cc;
      r.Integer(item, name, "index", sg.index, kNonNegativeInt);
      r.String(item, name, "uuid", sg.uuid);
      if (r.ok() && !IsGpuUuid(sg.uuid))
        r.Fail(fmt::format("field `{}.uuid` is \"{}\", not a GPU UUID (GPU-8-4-4-4-12 hex digits)", name, sg.uuid));
      r.String(item, name, "name", sg.name, false);
      r.String(item, name, "compute_capability", cc);
      r.Integer(item, name, "total_bytes", sg.total_bytes, kBytes, false);
      int major = 0, minor = 0;
      if (r.ok() && !ParseVersion(cc, major, minor))
        r.Fail(fmt::format("field `{}.compute_capability` is \"{}\", not MAJOR.MINOR", name, cc));
      sg.cc_major = major;
      sg.cc_minor = minor;
      gs.gpus.push_back(sg);
    }
  }
  m.gpu = gs;
}

void ReadCapturePath(Reader& r, const json& j, SnapshotMeta& m) {
  RequireSince(r, m, 6, j, "capture_path", "capture_path");
  const json* c = r.Object(j, "", "capture_path", false);
  if (c == nullptr) return;
  CapturePathRecord& cp = m.capture_path;
  std::string path, requested;
  r.String(*c, "capture_path", "path", path);
  r.String(*c, "capture_path", "requested", requested);
  r.String(*c, "capture_path", "reason", cp.reason, false);
  if (!r.ok()) return;
  std::optional<CapturePath> taken = ParseCapturePath(path), asked = ParseCapturePath(requested);
  if (!taken || *taken == CapturePath::kAuto)
    return r.Fail(fmt::format("field `capture_path.path` is \"{}\", not \"process\", \"rootfs\" or \"both\"", path));
  if (!asked)
    return r.Fail(fmt::format("field `capture_path.requested` is \"{}\", not \"auto\", \"process\", \"rootfs\" or "
                              "\"both\"",
                              requested));
  cp.path = *taken;
  cp.requested = *asked;
}

void ReadRootfs(Reader& r, const json& j, SnapshotMeta& m) {
  const json* f = r.Object(j, "", "rootfs", m.capture_path.has_rootfs());
  if (f == nullptr) return;
  if (!m.capture_path.has_rootfs())
    return r.Fail(fmt::format("field `rootfs` is there, but capture_path.path is \"{}\"",
                              CapturePathName(m.capture_path.path)));
  RootfsRecord rf;
  r.String(*f, "rootfs", "image", rf.image);
  r.String(*f, "rootfs", "image_id", rf.image_id, false);
  r.StringArray(*f, "rootfs", "command", rf.command);
  if (r.ok() && rf.command.empty()) r.Fail("field `rootfs.command` is empty");
  r.String(*f, "rootfs", "cwd", rf.cwd, false);
  r.String(*f, "rootfs", "upper", rf.upper, false);
  r.StringArray(*f, "rootfs", "lowers", rf.lowers, false);
  r.StringArray(*f, "rootfs", "excluded", rf.excluded, false);
  r.StringArray(*f, "rootfs", "excluded_paths", rf.excluded_paths, false);
  r.Integer(*f, "rootfs", "entries", rf.entries, kBytes, false);
  r.Integer(*f, "rootfs", "deleted", rf.deleted, kBytes, false);
  r.Array(*f, "rootfs", "skipped", false, [&](const json& v, const std::string& name) {
    if (!v.is_object()) return r.Fail(fmt::format("field `{}` is {}, not an object", name, v.type_name()));
    RootfsSkipped sk;
    r.String(v, name, "path", sk.path);
    r.String(v, name, "reason", sk.reason, false);
    rf.skipped.push_back(sk);
  });
  r.Array(*f, "rootfs", "caches", false, [&](const json& v, const std::string& name) {
    if (!v.is_object()) return r.Fail(fmt::format("field `{}` is {}, not an object", name, v.type_name()));
    RootfsCache c;
    r.String(v, name, "path", c.path, true, /*nonempty=*/true);
    r.String(v, name, "file", c.file, true, /*nonempty=*/true);
    r.Bool(v, name, "mount", c.mount);
    r.Integer(v, name, "entries", c.entries, kBytes, false);
    if (r.ok() && !IsSafeFilePath(c.file)) r.Fail(fmt::format("field `{}.file` is an unsafe path `{}`", name, c.file));
    if (r.ok() && (c.path.empty() || c.path[0] != '/'))
      r.Fail(fmt::format("field `{}.path` is \"{}\", not an absolute container path", name, c.path));
    rf.caches.push_back(c);
  });
  m.rootfs = std::move(rf);
}

// Optional in every minor: a snapshot taken outside Kubernetes has none.
void ReadOwner(Reader& r, const json& j, SnapshotMeta& m) {
  const json* o = r.Object(j, "", "owner", false);
  if (o == nullptr) return;
  SnapshotOwner owner;
  r.String(*o, "owner", "namespace", owner.namespace_name);
  r.String(*o, "owner", "pod", owner.pod);
  if (r.ok() && !IsDns1123Label(owner.namespace_name))
    return r.Fail(fmt::format("field `owner.namespace` is {}, not a Kubernetes namespace name",
                              Quote(owner.namespace_name)));
  if (r.ok() && !IsDns1123Subdomain(owner.pod))
    return r.Fail(fmt::format("field `owner.pod` is {}, not a Kubernetes pod name", Quote(owner.pod)));
  m.owner = std::move(owner);
}

Status Corrupt(const Reader& r) { return Status::Error(Code::kCorruption, "metadata: {}", r.failure()); }

}  // namespace

std::string_view CapturePathName(CapturePath path) {
  switch (path) {
    case CapturePath::kAuto: return "auto";
    case CapturePath::kProcess: return "process";
    case CapturePath::kRootfs: return "rootfs";
    case CapturePath::kBoth: return "both";
  }
  return "process";
}

std::optional<CapturePath> ParseCapturePath(std::string_view name) {
  for (CapturePath p : {CapturePath::kAuto, CapturePath::kProcess, CapturePath::kRootfs, CapturePath::kBoth})
    if (CapturePathName(p) == name) return p;
  return std::nullopt;
}

bool IsValidSnapshotId(std::string_view id) {
  if (id.empty() || id.size() > 64 || id[0] == '.') return false;
  for (char c : id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
              c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string SnapshotMetaToJson(const SnapshotMeta& m) {
  json files = json::object();
  for (const auto& [path, d] : m.files) files[path] = {{"size", d.size}, {"sha256", d.sha256}};
  json j = {
      {"schema_version", fmt::format("{}.{}", m.schema_major, m.schema_minor)},
      {"id", m.id},
      {"created", m.created},
      {"hostname", m.hostname},
      {"kernel", m.kernel},
      {"source",
       {{"kind", m.source.kind},
        {"name", m.source.name},
        {"host_pid", m.source.host_pid},
        {"ns_pid", m.source.ns_pid},
        {"cmdline", m.source.cmdline},
        {"log", m.source.log}}},
      {"criu",
       {{"version", m.criu_version},
        {"tcp_established", m.tcp_established},
        {"shell_job", m.shell_job},
        {"listen_ports", m.listen_ports}}},
      {"pids", m.pids},
      {"total_bytes", m.total_bytes},
      {"digest", m.digest},
      {"files", files},
      {"timings_s", m.timings_s},
  };
  if (m.gpu) {
    json gpus = json::array();
    for (const auto& g : m.gpu->gpus)
      gpus.push_back({{"index", g.index},
                      {"uuid", g.uuid},
                      {"name", g.name},
                      {"compute_capability", fmt::format("{}.{}", g.cc_major, g.cc_minor)},
                      {"total_bytes", g.total_bytes}});
    j["gpu"] = {{"driver_version", m.gpu->driver_version},
                {"cuda_version", m.gpu->cuda_version},
                {"gpus", gpus},
                {"ns_pids", m.gpu->ns_pids},
                {"restore_tids", m.gpu->restore_tids}};
    if (m.gpu->gpushare)
      j["gpu"]["gpushare"] = {{"chunk_store", m.gpu->chunk_store},
                              {"control_sockets", m.gpu->control_sockets},
                              {"shim", m.gpu->shim}};
  }
  if (Since(m, 6)) {
    j["capture_path"] = {{"path", CapturePathName(m.capture_path.path)},
                         {"requested", CapturePathName(m.capture_path.requested)},
                         {"reason", m.capture_path.reason}};
    if (!m.capture_path.has_process()) j.erase("criu");
  }
  if (m.rootfs) {
    const RootfsRecord& rf = *m.rootfs;
    json skipped = json::array(), caches = json::array();
    for (const auto& s : rf.skipped) skipped.push_back({{"path", s.path}, {"reason", s.reason}});
    for (const auto& c : rf.caches)
      caches.push_back({{"path", c.path}, {"file", c.file}, {"mount", c.mount}, {"entries", c.entries}});
    j["rootfs"] = {{"image", rf.image},     {"image_id", rf.image_id},     {"command", rf.command},
                   {"cwd", rf.cwd},         {"upper", rf.upper},           {"lowers", rf.lowers},
                   {"excluded", rf.excluded}, {"excluded_paths", rf.excluded_paths}, {"skipped", skipped},
                   {"entries", rf.entries}, {"deleted", rf.deleted},       {"caches", caches}};
  }
  if (m.owner) j["owner"] = {{"namespace", m.owner->namespace_name}, {"pod", m.owner->pod}};
  // Metadata of an older schema (an old snapshot shown by `inspect`, or sent
  // by the agent) is passed on as that schema wrote it, without the digest.
  if (m.schema_major > 1 || m.schema_minor >= 5) {
    if (auto digest = MetaDigest(j.dump()); digest.ok()) j[kMetaDigestField] = *digest;
  }
  return j.dump(2) + "\n";
}

Result<SnapshotMeta> SnapshotMetaFromJson(std::string_view text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    // nlohmann's text names line and column and what it expected; the byte
    // offset is what a tool (dd, cmp) finds the spot by.
    std::string why = e.what();
    if (auto pos = why.find("] "); pos != std::string::npos) why = why.substr(pos + 2);
    return Status::Error(Code::kCorruption, "metadata has a JSON syntax error at byte {}: {}", e.byte, why);
  }
  if (!j.is_object()) return Status::Error(Code::kCorruption, "metadata is {}, not a JSON object", j.type_name());
  SnapshotMeta m;
  Reader r;
  std::string version;
  r.String(j, "", "schema_version", version);
  if (!r.ok()) return Corrupt(r);
  if (!ParseVersion(version, m.schema_major, m.schema_minor))
    return Status::Error(Code::kCorruption, "metadata: schema_version `{}` is not MAJOR.MINOR", version);
  if (m.schema_major != kSchemaMajor)
    return Status::Error(Code::kNotSupported, "snapshot schema version {} is not supported (this gpusnap reads {}.x)",
                         version, kSchemaMajor);
  // Computed whatever the version, for it also refuses a key given twice
  // (which a plain parse would take the last of).
  GPUSNAP_ASSIGN_OR_RETURN(std::string actual, MetaDigest(text));
  if (const json* recorded = r.Member(j, kMetaDigestField, kMetaDigestField, false)) {
    if (!recorded->is_string() || !IsLowerHex(recorded->get_ref<const std::string&>(), 64))
      return Status::Error(Code::kCorruption, "metadata: field `{}` is {}, not 64 lower-case hex digits",
                           kMetaDigestField, Quote(*recorded));
    // Checked whenever it is there, whatever schema_version says: a flipped
    // bit there must not turn the check off.
    if (actual != recorded->get<std::string>())
      return Status::Error(Code::kCorruption,
                           "metadata does not match its digest (`{}` is {}, its content hashes to {}): gpusnap.json "
                           "was changed or corrupted",
                           kMetaDigestField, recorded->get<std::string>(), actual);
  } else if (Since(m, 5)) {
    return Status::Error(Code::kCorruption, "metadata: missing field `{}` (required since schema 1.5)",
                         kMetaDigestField);
  }
  r.String(j, "", "id", m.id);
  if (r.ok() && !IsValidSnapshotId(m.id)) return Status::Error(Code::kCorruption, "metadata: invalid id `{}`", m.id);
  r.String(j, "", "created", m.created);
  if (r.ok() && !IsRfc3339(m.created))
    r.Fail(fmt::format("field `created` is \"{}\", not an RFC 3339 time", m.created));
  r.String(j, "", "hostname", m.hostname, false);
  r.String(j, "", "kernel", m.kernel, false);
  ReadSource(r, j, m);
  ReadCapturePath(r, j, m);
  // A rootfs-only snapshot holds no CRIU images: it has no CRIU version.
  if (m.capture_path.has_process() || j.contains("criu")) ReadCriu(r, j, m);
  r.IntegerArray(j, "", "pids", m.pids, kPid, false);
  RequireSince(r, m, 2, j, "digest", "digest");
  r.String(j, "", "digest", m.digest, false, /*nonempty=*/true);
  ReadFiles(r, j, m);
  uint64_t sum = 0;
  for (const auto& [_, d] : m.files) sum += d.size;
  m.total_bytes = sum;  // the default, where it is absent
  r.Integer(j, "", "total_bytes", m.total_bytes, kBytes, false);
  if (r.ok() && m.total_bytes != sum)
    r.Fail(fmt::format("field `total_bytes` is {}, but the files add up to {}", m.total_bytes, sum));
  ReadTimings(r, j, m);
  ReadGpu(r, j, m);
  ReadRootfs(r, j, m);
  ReadOwner(r, j, m);
  if (!r.ok()) return Corrupt(r);
  return m;
}

}  // namespace gpusnap
