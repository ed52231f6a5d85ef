#include "agent/service/job.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <tuple>

#include <nlohmann/json.hpp>

#include "agent/api/request.h"

namespace gpusnap::agent {

namespace {
using Json = nlohmann::json;
}  // namespace

const char* JobStateName(JobState state) {
  switch (state) {
    case JobState::kRunning: return "running";
    case JobState::kSucceeded: return "succeeded";
    case JobState::kFailed: return "failed";
  }
  return "unknown";
}

void ApplyProgress(Job& job, const std::string& phase, double seconds, uint64_t bytes, bool done) {
  job.phase = phase;
  if (done) {
    job.timings_s[phase] = seconds;
    job.bytes_done += bytes;
    if (job.bytes_total != 0 && job.bytes_done > job.bytes_total) job.bytes_total = job.bytes_done;
  }
}

void ApplyTransferProgress(Job& job, const std::string& phase, double seconds, uint64_t bytes, bool done) {
  JobTransfer& t = *job.transfer;
  if (!done) {
    t.bytes_moved += bytes;
    t.progress = phase;
    return;
  }
  // The transfer's own phase ("pull", "push") or a step of it ("verify").
  std::string verb = job.kind == "restore" ? "pull" : "push";
  std::string name = phase == verb ? phase : verb + "-" + phase;
  job.phase = name;
  job.timings_s[name] = seconds;
}

void FinishTransfer(Job& job, const TransferResult& r) {
  JobTransfer& t = *job.transfer;
  t.digest = r.manifest_digest;
  t.blobs = r.blobs;
  t.blobs_moved = r.blobs_moved;
  t.blobs_skipped = r.blobs_skipped;
  t.bytes_moved = r.bytes_moved;
  t.bytes_total = r.bytes_total;
  t.seconds = r.seconds;
  t.already_present = r.already_present;
  t.done = true;
  t.progress.clear();
  std::string verb = job.kind == "restore" ? "pull" : "push";
  job.phase = verb;
  job.timings_s[verb] = r.seconds;
}

void Succeed(Job& job, const std::string& now) {
  job.state = JobState::kSucceeded;
  job.finished = now;
  if (job.bytes_total < job.bytes_done) job.bytes_total = job.bytes_done;
}

void Fail(Job& job, const std::string& error, const std::string& now) {
  job.state = JobState::kFailed;
  job.error = error;
  job.finished = now;
}

Job Interrupted(Job job, bool snapshot_published, const std::string& now) {
  if (job.state != JobState::kRunning) return job;
  // `phase` is the last phase the operation reported finished.
  std::string where = job.phase.empty() ? "before its first phase ended" : "after phase `" + job.phase + "`";
  std::string outcome;
  if (job.kind == "checkpoint")
    outcome = snapshot_published ? "; snapshot `" + job.snapshot + "` had been published whole"
                                 : "; no snapshot was published";
  if (job.transfer && !job.transfer->done) {
    if (job.kind == "restore")
      outcome += "; its pull of `" + job.transfer->reference + "` had not finished (a new one goes on from there)";
    else if (snapshot_published)
      outcome += ", but its push to `" + job.transfer->reference + "` had not finished";
  }
  Fail(job, "the agent stopped " + where + " and was restarted" + outcome, now);
  return job;
}

std::vector<std::string> FinishedJobsBeyond(const std::map<std::string, Job>& jobs, size_t keep) {
  std::vector<const Job*> finished;
  for (const auto& [id, job] : jobs)
    if (job.state != JobState::kRunning) finished.push_back(&job);
  if (finished.size() <= keep) return {};
  auto last_first = [](const Job* a, const Job* b) {
    return std::tie(a->finished, a->created, a->id) > std::tie(b->finished, b->created, b->id);
  };
  std::sort(finished.begin(), finished.end(), last_first);
  std::vector<std::string> beyond;
  for (size_t i = keep; i < finished.size(); ++i) beyond.push_back(finished[i]->id);
  return beyond;
}

std::string JobToJson(const Job& job) {
  Json j = {
      {"id", job.id},
      {"kind", job.kind},
      {"state", JobStateName(job.state)},
      {"phase", job.phase},
      {"target", job.target},
      {"lockKey", job.lock_key},
      {"created", job.created},
      {"bytesDone", job.bytes_done},
      {"bytesTotal", job.bytes_total},
      {"timings", job.timings_s},
  };
  if (!job.finished.empty()) j["finished"] = job.finished;
  if (!job.error.empty()) j["error"] = job.error;
  if (!job.snapshot.empty()) j["snapshot"] = job.snapshot;
  if (job.restored_pid > 0) j["restoredPid"] = job.restored_pid;
  if (!job.restored_name.empty()) j["restoredName"] = job.restored_name;
  if (!job.workloads.empty()) j["workloads"] = job.workloads;
  if (job.transfer) {
    const JobTransfer& t = *job.transfer;
    Json tj = {{"reference", t.reference},   {"blobs", t.blobs},           {"blobsMoved", t.blobs_moved},
               {"blobsSkipped", t.blobs_skipped}, {"bytesMoved", t.bytes_moved}, {"bytesTotal", t.bytes_total},
               {"seconds", t.seconds},       {"done", t.done}};
    if (!t.digest.empty()) tj["digest"] = t.digest;
    if (!t.progress.empty()) tj["progress"] = t.progress;
    if (job.kind == "restore") tj["alreadyPresent"] = t.already_present;
    j[job.kind == "restore" ? "pull" : "push"] = tj;
  }
  if (job.capture_path) {
    const JobCapturePath& c = *job.capture_path;
    Json cj = {{"requested", c.requested}};
    if (!c.path.empty()) cj["path"] = c.path;
    if (!c.reason.empty()) cj["reason"] = c.reason;
    j["capturePath"] = cj;
  }
  if (!job.restore_path.empty()) j["restorePath"] = job.restore_path;
  if (!job.fallback_reason.empty()) j["fallbackReason"] = job.fallback_reason;
  if (!job.source.empty()) {
    Json procs = Json::array();
    for (const auto& p : job.source) procs.push_back({{"pid", p.pid}, {"startTime", p.start_time}});
    j["source"] = procs;
  }
  return j.dump(2) + "\n";
}

// An integer field read exactly: a float, a negative or a value out of T's
// range is a corrupt record, not a conversion (which would be undefined).
template <typename T>
T IntegerField(const Json& obj, const char* key, T fallback) {
  auto it = obj.find(key);
  if (it == obj.end()) return fallback;
  if (it->is_number_unsigned()) {
    auto v = it->get<uint64_t>();
    if (v <= static_cast<uint64_t>(std::numeric_limits<T>::max())) return static_cast<T>(v);
  } else if (it->is_number_integer()) {
    auto v = it->get<int64_t>();
    if (v >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
        (v < 0 || static_cast<uint64_t>(v) <= static_cast<uint64_t>(std::numeric_limits<T>::max())))
      return static_cast<T>(v);
  }
  throw std::out_of_range(fmt::format("`{}` is not an integer of its range: {}", key, it->dump()));
}

Result<Job> JobFromJson(std::string_view text) {
  Json j;
  try {
    j = Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    return Status::Error(Code::kCorruption, "job record: {}", e.what());
  }
  if (!j.is_object()) return Status::Error(Code::kCorruption, "job record: not a JSON object");
  Job job;
  try {
    job.id = j.at("id").get<std::string>();
    job.kind = j.at("kind").get<std::string>();
    std::string state = j.at("state").get<std::string>();
    if (state == "running") {
      job.state = JobState::kRunning;
    } else if (state == "succeeded") {
      job.state = JobState::kSucceeded;
    } else if (state == "failed") {
      job.state = JobState::kFailed;
    } else {
      return Status::Error(Code::kCorruption, "job record: unknown state `{}`", state);
    }
    job.phase = j.value("phase", "");
    job.target = j.value("target", "");
    job.lock_key = j.value("lockKey", "");
    job.created = j.value("created", "");
    job.finished = j.value("finished", "");
    job.bytes_done = IntegerField<uint64_t>(j, "bytesDone", 0);
    job.bytes_total = IntegerField<uint64_t>(j, "bytesTotal", 0);
    job.timings_s = j.value("timings", std::map<std::string, double>{});
    job.error = j.value("error", "");
    job.snapshot = j.value("snapshot", "");
    job.restored_pid = IntegerField<int>(j, "restoredPid", 0);
    job.restored_name = j.value("restoredName", "");
    if (j.contains("workloads")) {
      const Json& wj = j.at("workloads");
      if (!wj.is_array() || !std::all_of(wj.begin(), wj.end(), [](const Json& w) { return w.is_string(); }))
        return Status::Error(Code::kCorruption, "job record: `workloads` is not a list of names");
      job.workloads = wj.get<std::vector<std::string>>();
    }
    if (const char* key = job.kind == "restore" ? "pull" : "push"; j.contains(key)) {
      const Json& tj = j.at(key);
      if (!tj.is_object()) return Status::Error(Code::kCorruption, "job record: `{}` is not an object", key);
      JobTransfer t;
      t.reference = tj.value("reference", "");
      t.digest = tj.value("digest", "");
      t.progress = tj.value("progress", "");
      t.blobs = IntegerField<uint64_t>(tj, "blobs", 0);
      t.blobs_moved = IntegerField<uint64_t>(tj, "blobsMoved", 0);
      t.blobs_skipped = IntegerField<uint64_t>(tj, "blobsSkipped", 0);
      t.bytes_moved = IntegerField<uint64_t>(tj, "bytesMoved", 0);
      t.bytes_total = IntegerField<uint64_t>(tj, "bytesTotal", 0);
      t.seconds = tj.value("seconds", 0.0);
      t.already_present = tj.value("alreadyPresent", false);
      t.done = tj.value("done", false);
      job.transfer = std::move(t);
    }
    if (j.contains("capturePath")) {
      const Json& cj = j.at("capturePath");
      if (!cj.is_object()) return Status::Error(Code::kCorruption, "job record: `capturePath` is not an object");
      job.capture_path = JobCapturePath{cj.value("requested", ""), cj.value("path", ""), cj.value("reason", "")};
    }
    job.restore_path = j.value("restorePath", "");
    job.fallback_reason = j.value("fallbackReason", "");
    for (const auto& p : j.value("source", Json::array())) {
      if (!p.is_object() || !p.contains("pid") || !p.contains("startTime"))
        return Status::Error(Code::kCorruption, "job record: a source without pid and startTime");
      job.source.push_back({IntegerField<pid_t>(p, "pid", 0), IntegerField<uint64_t>(p, "startTime", 0)});
    }
  } catch (const Json::exception& e) {
    return Status::Error(Code::kCorruption, "job record: {}", e.what());
  } catch (const std::out_of_range& e) {
    return Status::Error(Code::kCorruption, "job record: {}", e.what());
  }
  if (!IsValidJobId(job.id)) return Status::Error(Code::kCorruption, "job record: invalid id `{}`", job.id);
  static constexpr std::string_view kKinds[] = {"checkpoint", "restore", "wake", "suspend", "resume", "swap", "warm"};
  if (std::find(std::begin(kKinds), std::end(kKinds), job.kind) == std::end(kKinds))
    return Status::Error(Code::kCorruption, "job record `{}`: unknown kind `{}`", job.id, job.kind);
  return job;
}

}  // namespace gpusnap::agent
