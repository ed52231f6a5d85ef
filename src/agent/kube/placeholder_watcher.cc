#include "agent/kube/placeholder_watcher.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <map>
#include <optional>
#include <thread>

#include "agent/kube/placeholder_pods.h"
#include "gpusnap/workload.h"
#include "k8s/annotations.h"
#include "k8s/kube_client.h"
#include "k8s/watch_event.h"
#include "store/registry_reference.h"
#include "util/clock.h"
#include "util/mutex.h"
#include "util/progress_bar.h"
#include "util/thread_annotations.h"

namespace gpusnap::agent {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr auto kPollInterval = std::chrono::milliseconds(200);
constexpr int kEventAttempts = 5;

std::string Describe(const PlaceholderPod& pod) { return pod.namespace_name + "/" + pod.name; }

}  // namespace

struct PlaceholderWatcher::Impl {
  KubeOptions options;
  Service& service;
  std::function<void(const std::string&)> log;
  std::unique_ptr<k8s::KubeClient> client;
  std::string selector;  // the query that selects this node's placeholders

  Mutex mu;
  std::condition_variable cv;  // stopping set, or a task scheduled
  bool stopping GUARDED_BY(mu) = false;
  // Work for the worker thread, by when it is due. Tasks marked `keep` (a
  // job followed, a result recorded) still run while stopping.
  struct Task {
    std::function<void()> run;
    bool keep = false;
  };
  std::multimap<Clock::time_point, Task> tasks GUARDED_BY(mu);
  std::atomic<bool> watch_done{false};
  std::thread watch_thread, worker_thread;

  // The worker thread's own: what it remembers of each pod, by uid, and the
  // progress it last showed on a pod, and when.
  std::map<std::string, Memory> memory;
  struct Shown {
    std::string progress;
    Clock::time_point at;
    bool pulled = false;
  };
  std::map<std::string, Shown> shown;

  Impl(const KubeOptions& o, Service& s, std::function<void(const std::string&)> l)
      : options(o), service(s), log(std::move(l)) {}

  bool Stopping() EXCLUDES(mu) {
    MutexLock lock(mu);
    return stopping;
  }

  void Schedule(std::chrono::duration<double> delay, bool keep, std::function<void()> run) EXCLUDES(mu) {
    {
      MutexLock lock(mu);
      if (stopping && !keep) return;
      tasks.emplace(Clock::now() + std::chrono::duration_cast<Clock::duration>(delay), Task{std::move(run), keep});
    }
    cv.notify_all();
  }

  double Backoff(int attempt) const {
    return std::min(options.retry_max_s, options.retry_initial_s * std::pow(2.0, std::min(attempt, 20)));
  }

  // Sleeps `seconds` unless stopped first; false when stopped.
  bool Pause(double seconds) EXCLUDES(mu) {
    auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    MutexLock lock(mu);
    while (!stopping)
      if (!lock.WaitUntil(cv, deadline)) return !stopping;
    return false;
  }

  // ------------------------------------------------------------ watch thread
  void WatchLoop() EXCLUDES(mu) {
    std::string rv;  // where the watch resumes; empty: list first
    int failures = 0;
    while (!Stopping()) {
      if (rv.empty()) {
        auto list = client->Get("/api/v1/pods?" + selector);
        if (!list.ok() || !(*list)["metadata"].is_object() || !(*list)["items"].is_array()) {
          Status st = list.ok() ? Status::Error(Code::kExternal, "the pod list has no metadata or items")
                                : list.status();
          log(fmt::format("kube: listing placeholder pods: {}; again in {:.1f} s", st.ToString(), Backoff(failures)));
          if (!Pause(Backoff(failures++))) break;
          continue;
        }
        rv = (*list)["metadata"].value("resourceVersion", "");
        auto& items = (*list)["items"];
        log(fmt::format("kube: {} placeholder pod(s) on node {} (resourceVersion {})", items.size(),
                        options.node_name, rv));
        for (json& pod : items) Schedule(std::chrono::seconds(0), false, [this, pod] { Handle(pod); });
        failures = 0;
        if (rv.empty()) {
          log("kube: the pod list has no resourceVersion; listing again");
          if (!Pause(Backoff(failures++))) break;
          continue;
        }
      }
      bool expired = false;
      std::string stream_error;
      std::string path = fmt::format("/api/v1/pods?{}&watch=true&allowWatchBookmarks=true&resourceVersion={}"
                                     "&timeoutSeconds={}",
                                     selector, k8s::QueryEscape(rv), options.watch_timeout_s);
      auto end = client->Watch(path, options.watch_timeout_s + 30, [&](std::string_view line) {
        auto event = k8s::ParseWatchEvent(line);
        if (!event.ok()) {
          stream_error = event.status().ToString();
          return false;
        }
        if (k8s::IsExpired(*event)) {
          expired = true;
          return false;
        }
        if (event->type == k8s::WatchEventType::kError) {
          stream_error = "the watch reported " + k8s::StatusMessage(event->object.dump());
          return false;
        }
        rv = event->resource_version;
        if (event->type == k8s::WatchEventType::kAdded || event->type == k8s::WatchEventType::kModified) {
          Schedule(std::chrono::seconds(0), false, [this, pod = std::move(event->object)] { Handle(pod); });
        } else if (event->type == k8s::WatchEventType::kDeleted) {
          std::string uid = event->object["metadata"].value("uid", "");
          Schedule(std::chrono::seconds(0), false, [this, uid] { memory.erase(uid); });
        }
        return true;
      });
      if (Stopping()) break;
      if (expired || (end.ok() && *end == k8s::KubeClient::WatchEnd::kExpired)) {
        log(fmt::format("kube: resourceVersion {} is too old for the API server: listing again", rv));
        rv.clear();
        continue;
      }
      if (end.ok() && *end == k8s::KubeClient::WatchEnd::kClosed) {
        failures = 0;
        continue;
      }
      std::string why = end.ok() ? stream_error : end.status().ToString();
      log(fmt::format("kube: watching placeholder pods: {}; again in {:.1f} s", why, Backoff(failures)));
      if (!Pause(Backoff(failures++))) break;
    }
    watch_done = true;
  }

  // ----------------------------------------------------------- worker thread
  void WorkLoop() EXCLUDES(mu) {
    while (std::optional<Task> task = NextTask()) task->run();
  }

  // Waits for the next task that is due; nullopt once stopping leaves none.
  std::optional<Task> NextTask() EXCLUDES(mu) {
    MutexLock lock(mu);
    while (true) {
      if (stopping) std::erase_if(tasks, [](const auto& t) { return !t.second.keep; });
      if (stopping && tasks.empty()) return std::nullopt;
      if (tasks.empty()) {
        lock.Wait(cv);
        continue;
      }
      auto first = tasks.begin();
      if (first->first > Clock::now()) {
        lock.WaitUntil(cv, first->first);
        continue;
      }
      Task task = std::move(first->second);
      tasks.erase(first);
      return task;
    }
  }

  void Handle(const json& pod) {
    auto meta = pod.find("metadata");
    std::string uid = meta != pod.end() && meta->is_object() ? meta->value("uid", "") : "";
    auto known = memory.find(uid);
    PodDecision d = DecidePod(pod, options.node_name, known == memory.end() ? Memory::kNone : known->second);
    const PlaceholderPod& p = d.pod;
    switch (d.step) {
      case PodStep::kIgnore:
      case PodStep::kWait:
      case PodStep::kDone:
        return;
      case PodStep::kFail:
        log(fmt::format("kube: pod {}: cannot restore: {}", Describe(p), d.reason));
        Claim(p, RestoreRecord{std::string(k8s::kRestoreStatusFailed), "", d.reason}, [this, p, reason = d.reason] {
          Recorded(p, false, reason);
        });
        return;
      case PodStep::kRecover:
        Recover(p);
        return;
      case PodStep::kRestore:
        Claim(p, RestoreRecord{std::string(k8s::kRestoreStatusRestoring), "", ""}, [this, p] { StartRestore(p); });
        return;
    }
  }

  // Writes `record` on the pod if it is still the version decided on; then
  // `then`. A pod that changed meanwhile is read again and decided anew.
  void Claim(const PlaceholderPod& p, const RestoreRecord& record, const std::function<void()>& then) {
    memory[p.uid] = Memory::kInHand;
    auto patched = client->MergePatch(PodPath(p), RecordPatch(record, p.resource_version));
    if (patched.ok()) return then();
    memory.erase(p.uid);
    if (patched.status().code() == Code::kNotFound) return;
    bool conflict = patched.status().code() == Code::kAlreadyExists;
    if (!conflict) log(fmt::format("kube: pod {}: {}; trying again", Describe(p), patched.status().ToString()));
    Reread(p, conflict ? 0 : 1);
  }

  // Reads the pod again and decides anew, after a pause for attempts > 0.
  void Reread(const PlaceholderPod& p, int attempt) {
    Schedule(std::chrono::duration<double>(attempt == 0 ? 0 : Backoff(attempt - 1)), false, [this, p, attempt] {
      auto pod = client->Get(PodPath(p));
      if (pod.ok()) return Handle(*pod);
      if (pod.status().code() == Code::kNotFound) return;
      log(fmt::format("kube: pod {}: {}", Describe(p), pod.status().ToString()));
      Reread(p, attempt + 1);
    });
  }

  void StartRestore(const PlaceholderPod& p, int attempt = 0) {
    RestoreRequest request;
    request.source = *p.source;  // Decide sends only pods whose annotation parsed
    request.target_container = p.container_id;
    request.name = WorkloadNameForPod(p.name, p.uid);
    // A tenant's restore: its namespace's rules govern it (docs/SECURITY.md).
    auto started = service.StartRestore(request, container::PodRef{p.namespace_name, p.name, p.container});
    if (auto* refused = std::get_if<Refused>(&started)) {
      if (!refused->job_id.empty()) {
        // Another job holds the snapshot or the container (a second pod
        // restoring the same snapshot): the pod is ours, start once it is done.
        if (attempt == 0) log(fmt::format("kube: pod {}: waiting: {}", Describe(p), refused->error.message));
        Schedule(std::chrono::duration<double>(std::min(Backoff(attempt), 5.0)), false,
                 [this, p, attempt] { StartRestore(p, attempt + 1); });
        return;
      }
      log(fmt::format("kube: pod {}: restore of `{}` refused: {}", Describe(p), p.snapshot, refused->error.message));
      return Record(p, RestoreRecord{std::string(k8s::kRestoreStatusFailed), "", refused->error.message}, false,
                    refused->error.message, 0);
    }
    std::string job = std::get<Accepted>(started).job_id;
    log(fmt::format("kube: pod {}: restoring snapshot `{}` into container {} ({}): job {}", Describe(p), p.snapshot,
                    p.container, p.container_id.substr(0, 12), job));
    // Best effort: the final record names the job too.
    auto named = client->MergePatch(PodPath(p), RecordPatch({std::string(k8s::kRestoreStatusRestoring), job, ""}));
    if (!named.ok()) log(fmt::format("kube: pod {}: naming job {}: {}", Describe(p), job, named.status().ToString()));
    Follow(p, job);
  }

  // Waits for the job to end, showing its progress on the pod, then records
  // its result.
  void Follow(const PlaceholderPod& p, const std::string& job_id) {
    Schedule(kPollInterval, true, [this, p, job_id] {
      auto job = service.GetJob(job_id);
      if (job.ok() && job->state == JobState::kRunning) {
        ShowProgress(p, *job);
        return Follow(p, job_id);
      }
      shown.erase(p.uid);
      if (!job.ok()) {
        std::string why = fmt::format("job {} is gone from the agent", job_id);
        return Record(p, RestoreRecord{std::string(k8s::kRestoreStatusFailed), job_id, why}, false, why, 0);
      }
      RecordJob(p, *job);
    });
  }

  // What changed, at most once a second but for the end of the pull: a best
  // effort, which the result's record removes.
  void ShowProgress(const PlaceholderPod& p, const Job& job) {
    std::string progress = RestoreProgress(job);
    bool pulled = job.transfer && job.transfer->done;
    Shown& last = shown[p.uid];
    if (progress.empty() || progress == last.progress ||
        (pulled == last.pulled && Clock::now() - last.at < std::chrono::seconds(1)))
      return;
    last = {progress, Clock::now(), pulled};
    auto patched = client->MergePatch(PodPath(p), ProgressPatch(progress));
    if (!patched.ok())
      log(fmt::format("kube: pod {}: showing progress: {}", Describe(p), patched.status().ToString()));
  }

  void RecordJob(const PlaceholderPod& p, const Job& job) {
    bool ok = job.state == JobState::kSucceeded;
    // A reference's job names it and what its pull did.
    std::string what = fmt::format("snapshot `{}`", job.snapshot);
    if (job.transfer) {
      const JobTransfer& t = *job.transfer;
      what = !t.done            ? fmt::format("`{}`", t.reference)
             : t.already_present ? fmt::format("snapshot `{}` (from {}, {}, already in the node's store)", job.snapshot,
                                              t.reference, t.digest)
                                 : fmt::format("snapshot `{}` (pulled from {}, {}: {} of {} blobs, {})", job.snapshot,
                                              t.reference, t.digest, t.blobs_moved, t.blobs,
                                              HumanBytes(t.bytes_moved));
    }
    // A rootfs restore is a cold start: the pod's readers should know.
    std::string how = job.restore_path != "rootfs"     ? ""
                      : job.fallback_reason.empty() ? "; by the rootfs path (a cold start)"
                                                    : "; by the rootfs path, not as a process: " + job.fallback_reason;
    std::string message =
        ok ? fmt::format("restored {} into container {} (pid {} on the node) in {:.2f} s: job {}{}", what,
                         p.container, job.restored_pid, job.timings_s.count("total") ? job.timings_s.at("total") : 0.0,
                         job.id, how)
           : fmt::format("restore of {} failed: {} (job {})", what, job.error, job.id);
    RestoreRecord record{std::string(ok ? k8s::kRestoreStatusRestored : k8s::kRestoreStatusFailed), job.id,
                         ok ? "" : job.error};
    if (ok) {
      record.path = job.restore_path;
      record.fallback_reason = job.fallback_reason;
    }
    Record(p, record, ok, message, 0);
  }

  // A previous agent claimed the pod: record what became of its job.
  void Recover(const PlaceholderPod& p) {
    memory[p.uid] = Memory::kInHand;
    std::vector<Job> jobs = service.ListJobs();
    const Job* job = FindRestoreJob(jobs, p);
    if (job && job->state == JobState::kRunning) return Follow(p, job->id);
    if (job) {
      log(fmt::format("kube: pod {}: recording job {} of an earlier agent", Describe(p), job->id));
      return RecordJob(p, *job);
    }
    std::string why = fmt::format("the agent stopped before its restore job started; remove the annotation {} to "
                                  "try again",
                                  k8s::kAnnotationRestoreStatus);
    Record(p, RestoreRecord{std::string(k8s::kRestoreStatusFailed), p.restore_job, why}, false, why, 0);
  }

  // Writes the result on the pod until the API server takes it; then the Event.
  void Record(const PlaceholderPod& p, const RestoreRecord& record, bool restored, const std::string& message,
              int attempt) {
    memory[p.uid] = Memory::kInHand;
    auto patched = client->MergePatch(PodPath(p), RecordPatch(record));
    if (!patched.ok() && patched.status().code() != Code::kNotFound) {
      if (Stopping()) {
        log(fmt::format("kube: pod {}: result not recorded ({}): the next agent will", Describe(p),
                        patched.status().ToString()));
        return;
      }
      log(fmt::format("kube: pod {}: recording `{}`: {}; again in {:.1f} s", Describe(p), record.status,
                      patched.status().ToString(), Backoff(attempt)));
      Schedule(std::chrono::duration<double>(Backoff(attempt)), true,
               [this, p, record, restored, message, attempt] { Record(p, record, restored, message, attempt + 1); });
      return;
    }
    memory[p.uid] = Memory::kRecorded;
    if (!patched.ok()) {
      log(fmt::format("kube: pod {} is gone; its restore {}: {}", Describe(p), record.status, message));
      return;
    }
    Recorded(p, restored, message);
  }

  void Recorded(const PlaceholderPod& p, bool restored, const std::string& message) {
    memory[p.uid] = Memory::kRecorded;
    log(fmt::format("kube: pod {}: {}: {}", Describe(p),
                    restored ? k8s::kRestoreStatusRestored : k8s::kRestoreStatusFailed, message));
    PostEvent(p, restored, message, 0);
  }

  void PostEvent(const PlaceholderPod& p, bool restored, const std::string& message, int attempt) {
    auto now = std::chrono::system_clock::now().time_since_epoch();
    json event = RestoreEvent(p, restored, message, options.node_name, NowRfc3339(),
                              fmt::format("{:x}", std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()));
    auto posted = client->Post(EventsPath(p), event);
    if (posted.ok()) return;
    if (attempt + 1 >= kEventAttempts || Stopping()) {
      log(fmt::format("kube: pod {}: event not posted: {}", Describe(p), posted.status().ToString()));
      return;
    }
    Schedule(std::chrono::duration<double>(Backoff(attempt)), true,
             [this, p, restored, message, attempt] { PostEvent(p, restored, message, attempt + 1); });
  }
};

PlaceholderWatcher::PlaceholderWatcher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PlaceholderWatcher::~PlaceholderWatcher() { Stop(); }

Result<std::unique_ptr<PlaceholderWatcher>> PlaceholderWatcher::Start(const KubeOptions& options, Service& service,
                                                                      std::function<void(const std::string&)> log) {
  if (options.node_name.empty())
    return Status::Error(Code::kInvalidArgument, "--kube needs this node's name: --node-name or $NODE_NAME");
  if (options.watch_timeout_s < 1 || options.retry_initial_s <= 0 || options.retry_max_s < options.retry_initial_s)
    return Status::Error(Code::kInvalidArgument, "kube: bad watch timeout or retry pauses");
  auto config = options.kubeconfig.empty() ? k8s::LoadInClusterConfig() : k8s::LoadKubeconfig(options.kubeconfig);
  if (!config.ok()) return config.status().Wrap("kube");
  auto client = k8s::KubeClient::Create(std::move(*config));
  if (!client.ok()) return client.status().Wrap("kube");

  auto impl = std::make_unique<Impl>(options, service, std::move(log));
  impl->client = std::move(*client);
  impl->selector = fmt::format("labelSelector={}&fieldSelector={}",
                               k8s::QueryEscape(fmt::format("{}={}", k8s::kLabelPlaceholder, k8s::kLabelPlaceholderOn)),
                               k8s::QueryEscape("spec.nodeName=" + options.node_name));
  impl->log(fmt::format("kube: restoring into the placeholder pods of node {} (API server {})", options.node_name,
                        impl->client->server()));
  Impl* raw = impl.get();
  impl->worker_thread = std::thread([raw] { raw->WorkLoop(); });
  impl->watch_thread = std::thread([raw] { raw->WatchLoop(); });
  return std::unique_ptr<PlaceholderWatcher>(new PlaceholderWatcher(std::move(impl)));
}

void PlaceholderWatcher::Stop() {
  if (!impl_) return;
  {
    MutexLock lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  // A watch that had not connected when Stop() came is stopped once it has.
  while (!impl_->watch_done) {
    impl_->client->Stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (impl_->watch_thread.joinable()) impl_->watch_thread.join();
  if (impl_->worker_thread.joinable()) impl_->worker_thread.join();
  impl_.reset();
}

}  // namespace gpusnap::agent
