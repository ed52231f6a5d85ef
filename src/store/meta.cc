#include <nlohmann/json.hpp>

#include "gpusnap/snapshot.h"

namespace gpusnap {

using nlohmann::json;

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
  return j.dump(2) + "\n";
}

namespace {

// Reads j[key] as T, or records why not. Keeps parsing readable below.
class Reader {
 public:
  template <typename T>
  void Get(const json& j, const char* key, T& out, bool required = true) {
    if (!failure_.empty()) return;
    auto it = j.find(key);
    if (it == j.end()) {
      if (required) failure_ = fmt::format("missing field `{}`", key);
      return;
    }
    try {
      out = it->get<T>();
    } catch (const json::exception&) {
      failure_ = fmt::format("field `{}` has the wrong type ({})", key, it->type_name());
    }
  }
  const json* Object(const json& j, const char* key) {
    if (!failure_.empty()) return nullptr;
    auto it = j.find(key);
    if (it == j.end() || !it->is_object()) {
      failure_ = fmt::format("missing object `{}`", key);
      return nullptr;
    }
    return &*it;
  }
  std::string failure_;
};

}  // namespace

Result<SnapshotMeta> SnapshotMetaFromJson(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::Error(Code::kCorruption, "metadata is not a JSON object");
  SnapshotMeta m;
  Reader r;
  std::string version;
  r.Get(j, "schema_version", version);
  if (!r.failure_.empty()) return Status::Error(Code::kCorruption, "metadata: {}", r.failure_);
  if (std::sscanf(version.c_str(), "%d.%d", &m.schema_major, &m.schema_minor) != 2)
    return Status::Error(Code::kCorruption, "metadata: schema_version `{}` is not MAJOR.MINOR", version);
  if (m.schema_major != kSchemaMajor)
    return Status::Error(Code::kNotSupported, "snapshot schema version {} is not supported (this gpusnap reads {}.x)",
                         version, kSchemaMajor);
  r.Get(j, "id", m.id);
  r.Get(j, "created", m.created);
  r.Get(j, "hostname", m.hostname, false);
  r.Get(j, "kernel", m.kernel, false);
  if (const json* s = r.Object(j, "source")) {
    r.Get(*s, "kind", m.source.kind);
    r.Get(*s, "name", m.source.name, false);
    r.Get(*s, "host_pid", m.source.host_pid);
    r.Get(*s, "ns_pid", m.source.ns_pid);
    r.Get(*s, "cmdline", m.source.cmdline, false);
    r.Get(*s, "log", m.source.log, false);
  }
  if (const json* c = r.Object(j, "criu")) {
    r.Get(*c, "version", m.criu_version);
    r.Get(*c, "tcp_established", m.tcp_established, false);
    r.Get(*c, "shell_job", m.shell_job, false);
    r.Get(*c, "listen_ports", m.listen_ports, false);  // absent before 1.4
  }
  r.Get(j, "pids", m.pids, false);
  r.Get(j, "total_bytes", m.total_bytes, false);
  r.Get(j, "digest", m.digest, false);  // absent before 1.2: whole-file SHA-256
  r.Get(j, "timings_s", m.timings_s, false);
  if (const json* files = r.Object(j, "files")) {
    for (const auto& [path, d] : files->items()) {
      FileDigest fd;
      if (!d.is_object()) {
        r.failure_ = fmt::format("files[`{}`] is not an object", path);
        break;
      }
      r.Get(d, "size", fd.size);
      r.Get(d, "sha256", fd.sha256);
      if (path.empty() || path[0] == '/' || path.find("..") != std::string::npos)
        r.failure_ = fmt::format("files has an unsafe path `{}`", path);
      if (!r.failure_.empty()) break;
      m.files[path] = fd;
    }
  }
  if (auto g = j.find("gpu"); g != j.end() && r.failure_.empty()) {
    SnapshotGpuState gs;
    r.Get(*g, "driver_version", gs.driver_version);
    r.Get(*g, "cuda_version", gs.cuda_version);
    r.Get(*g, "ns_pids", gs.ns_pids);
    r.Get(*g, "restore_tids", gs.restore_tids);
    if (auto share = g->find("gpushare"); share != g->end()) {
      gs.gpushare = true;
      r.Get(*share, "chunk_store", gs.chunk_store);
      r.Get(*share, "control_sockets", gs.control_sockets);
      r.Get(*share, "shim", gs.shim, false);
      if (r.failure_.empty() && gs.control_sockets.size() != gs.ns_pids.size())
        r.failure_ = fmt::format("gpu.gpushare has {} control sockets for {} GPU processes",
                                 gs.control_sockets.size(), gs.ns_pids.size());
    }
    json gpus;
    r.Get(*g, "gpus", gpus);
    for (const auto& item : gpus.is_array() ? gpus : json::array()) {
      SnapshotGpu sg;
      std::string cc;
      r.Get(item, "index", sg.index);
      r.Get(item, "uuid", sg.uuid);
      r.Get(item, "name", sg.name, false);
      r.Get(item, "compute_capability", cc);
      r.Get(item, "total_bytes", sg.total_bytes, false);
      if (r.failure_.empty() && std::sscanf(cc.c_str(), "%d.%d", &sg.cc_major, &sg.cc_minor) != 2)
        r.failure_ = fmt::format("gpu compute_capability `{}` is not MAJOR.MINOR", cc);
      gs.gpus.push_back(sg);
    }
    m.gpu = gs;
  }
  if (!r.failure_.empty()) return Status::Error(Code::kCorruption, "metadata: {}", r.failure_);
  if (!IsValidSnapshotId(m.id)) return Status::Error(Code::kCorruption, "metadata: invalid id `{}`", m.id);
  return m;
}

}  // namespace gpusnap
