// libFuzzer target: everything the agent parses from a caller or from disk
// before acting (request bodies, path ids, bearer headers, cgroup files,
// kubelet log names, its own journal records). Beyond not crashing, each
// accepted input must satisfy what the agent relies on afterwards; a
// violation aborts, which libFuzzer reports with the input.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "agent/api/request.h"
#include "agent/service/job.h"
#include "container/cgroup.h"
#include "gpusnap/snapshot.h"
#include "store/registry_reference.h"

namespace {

using namespace gpusnap;
using namespace gpusnap::agent;
using namespace gpusnap::container;

void Require(bool condition) {
  if (!condition) std::abort();
}

bool NoPathSeparators(std::string_view s) { return s.find('/') == std::string_view::npos && s != ".." && s != "."; }

void CheckCheckpoint(std::string_view body) {
  auto r = ParseCheckpointRequest(body);
  if (auto* e = std::get_if<ApiError>(&r)) {
    Require(e->http_status >= 400 && e->http_status < 500 && !e->message.empty());
    return;
  }
  const auto& req = std::get<CheckpointRequest>(r);
  int targets = (req.pid != 0) + !req.container.empty() + req.pod.has_value();
  Require(targets == 1);
  Require(req.pid >= 0 && req.pid <= (1 << 22));
  Require(req.container.empty() || IsValidContainerId(req.container));
  Require(req.snapshot_id.empty() || (IsValidSnapshotId(req.snapshot_id) && NoPathSeparators(req.snapshot_id)));
  if (req.pod) {
    Require(NoPathSeparators(req.pod->namespace_name) && NoPathSeparators(req.pod->name) &&
            NoPathSeparators(req.pod->container));
    Require(req.pod->name.find('_') == std::string::npos);
  }
}

void CheckRestore(std::string_view body) {
  auto r = ParseRestoreRequest(body);
  if (auto* e = std::get_if<ApiError>(&r)) {
    Require(e->http_status >= 400 && e->http_status < 500 && !e->message.empty());
    return;
  }
  const auto& req = std::get<RestoreRequest>(r);
  // A snapshot id (no path in it), or a registry reference the grammar takes (no `..`, no empty component).
  if (req.source.from_registry()) {
    std::string reference = req.source.ToString();
    Require(req.source.id.empty() && ParseRegistryReference(reference).ok() &&
            reference.find("/../") == std::string::npos && reference.find("//") == std::string::npos);
  } else {
    Require(IsValidSnapshotId(req.source.id) && NoPathSeparators(req.source.id));
  }
  // What the client would send for it, the server reads back as the same request.
  auto again = ParseRestoreRequest(RestoreRequestBody(req));
  Require(std::holds_alternative<RestoreRequest>(again) && std::get<RestoreRequest>(again).source == req.source &&
          std::get<RestoreRequest>(again).gpus.ToString() == req.gpus.ToString());
  Require(req.target_container.empty() || IsValidContainerId(req.target_container));
  Require(req.name.empty() || NoPathSeparators(req.name));
}

void CheckJobRecord(std::string_view text) {
  auto job = JobFromJson(text);
  if (!job.ok()) {
    Require(job.status().code() == Code::kCorruption);
    return;
  }
  Require(IsValidJobId(job->id));
  // What the journal reads back, it writes back the same.
  auto again = JobFromJson(JobToJson(*job));
  Require(again.ok() && again->id == job->id && again->state == job->state && again->phase == job->phase &&
          again->source.size() == job->source.size());
}

void CheckCgroup(std::string_view text) {
  CgroupIdentity id = ParseProcCgroup(text);
  Require(id.container_id.empty() || (id.container_id.size() == 64 && IsValidContainerId(id.container_id)));
  Require(id.pod_uid.empty() || id.pod_uid.size() == 36);
  if (auto name = ParseKubeletLogName(text)) {
    Require(name->container_id.size() == 64 && NoPathSeparators(name->pod) && NoPathSeparators(name->container));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte picks the parser, so one corpus covers them all.
  std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 5) {
    case 0: CheckCheckpoint(input); break;
    case 1: CheckRestore(input); break;
    case 2: CheckJobRecord(input); break;
    case 3: CheckCgroup(input); break;
    case 4: {
      (void)BearerMatches(input, "0123456789abcdef-token");
      Require(!IsValidJobId(input) || input.size() == 20);
      break;
    }
  }
  return 0;
}
