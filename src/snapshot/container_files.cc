#include "snapshot/container_files.h"

#include <nlohmann/json.hpp>

namespace gpusnap {

using nlohmann::json;

static std::string DisplayName(const SnapshotMeta& meta) {
  return meta.source.name.empty() ? fmt::format("pid-{}", meta.source.host_pid) : meta.source.name;
}

std::string ConfigDumpJson(const SnapshotMeta& meta, const std::string& workload_started) {
  json j = {
      {"id", meta.id},
      {"name", DisplayName(meta)},
      {"rootfsImage", ""},
      {"rootfsImageRef", ""},
      {"rootfsImageName", ""},
      {"runtime", "gpusnap"},
      {"createdTime", workload_started.empty() ? meta.created : workload_started},
      {"checkpointedTime", meta.created},
      {"restoredTime", "0001-01-01T00:00:00Z"},
      {"restored", false},
  };
  return j.dump(2) + "\n";
}

std::string SpecDumpJson(const SnapshotMeta& meta) {
  json j = {
      {"ociVersion", "1.0.2"},
      {"process", {{"args", meta.source.cmdline}, {"cwd", "/"}, {"terminal", false}}},
      {"root", {{"path", "/"}}},
      {"hostname", meta.hostname},
      {"annotations",
       {{"io.container.manager", "gpusnap"},
        // checkpointctl reads names the way containerd's CRI plugin writes them.
        {"io.kubernetes.cri.container-name", DisplayName(meta)},
        {"org.gpusnap.snapshot.id", meta.id},
        {"org.gpusnap.source.name", DisplayName(meta)}}},
      {"linux", {{"namespaces", json::array({{{"type", "pid"}}, {{"type", "mount"}}})}}},
  };
  return j.dump(2) + "\n";
}

}  // namespace gpusnap
