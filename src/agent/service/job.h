// A job: one checkpoint or restore the agent runs, its state machine, and the
// journal record it is kept in on disk (<state dir>/jobs/<id>.json, rewritten
// atomically at every transition).
//
// States: running -> succeeded | failed. A job is created running; a phase
// change or progress keeps it running; it ends exactly once. A record found
// running when the agent starts belongs to an agent that died: Interrupted()
// turns it into failed, naming the last phase it finished.
//
// Pure: building, transitions and the record format do no I/O.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gpusnap/distribution.h"
#include "gpusnap/status.h"

namespace gpusnap::agent {

enum class JobState { kRunning, kSucceeded, kFailed };
const char* JobStateName(JobState state);

// A process as the agent found it when the job started: with its start time,
// so a later look can tell it from another process that reused the pid.
struct TrackedProcess {
  pid_t pid = 0;
  uint64_t start_time = 0;
};

// A job's transfer with a registry: a restore's pull of a reference before
// it restores, a checkpoint's push once its snapshot is published. Shown as
// the job's "pull" or "push" object.
struct JobTransfer {
  std::string reference;          // as asked
  std::string digest;             // the manifest's ("sha256:..."), once known
  std::string progress;           // while it runs: the last line the transfer reported
  uint64_t blobs = 0, blobs_moved = 0, blobs_skipped = 0;
  uint64_t bytes_moved = 0;       // counted as they move
  uint64_t bytes_total = 0;       // of the artifact, once done
  double seconds = 0;
  bool already_present = false;   // a pull that found the snapshot in the store
  bool done = false;
};

// A checkpoint's capture path (docs/CAPTURE-PATHS.md, "The matrix"): what
// was asked when the job started, then what the checkpoint took and why.
// Shown as the job's "capturePath".
struct JobCapturePath {
  std::string requested;  // "auto", "process", "rootfs" or "both"
  std::string path;       // "process", "rootfs" or "both"; empty until the checkpoint has chosen
  std::string reason;
};

struct Job {
  std::string id;                 // IsValidJobId
  std::string kind;               // "checkpoint", "restore", "wake" (of a standby), "suspend", "resume", "swap", "warm" (chunks pinned)
  JobState state = JobState::kRunning;
  std::string phase;              // the last phase the operation reported finished
  std::string target;             // what it acts on, for humans: "pid 4711", "container 3f2a…", "snapshot x"
  std::string lock_key;           // one running capture per key ("container:<id>", "pid:<pid>")
  std::string created, finished;  // RFC 3339
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;       // 0 while unknown
  std::map<std::string, double> timings_s;  // phase -> seconds, as phases end
  std::string error;              // failed: why
  std::string snapshot;           // the snapshot written (checkpoint) or read (restore)
  pid_t restored_pid = 0;         // restore, wake: the tree's root, host pid
  std::string restored_name;      // restore, wake: its workload name
  std::vector<TrackedProcess> source;  // checkpoint: the tree when the job started
  // suspend, resume: the workload; swap: the one suspended, then the one
  // resumed. A restarted agent makes each whole again (SettleWorkload).
  std::vector<std::string> workloads;
  std::optional<JobTransfer> transfer; // restore of a reference: its pull; checkpoint with push-to: its push
  std::optional<JobCapturePath> capture_path;  // checkpoint
  std::string restore_path;       // restore, once done: "process", or "rootfs" (a cold start with warm caches)
  std::string fallback_reason;    // restore of a `both` snapshot by rootfs: why not as a process
};

// A phase ended (`done`) or moved `bytes`: the job's new phase/bytes/timings.
// REQUIRES: job.state == kRunning.
void ApplyProgress(Job& job, const std::string& phase, double seconds, uint64_t bytes, bool done);
// The transfer's progress (REQUIRES: job.transfer): a line while it runs,
// and the bytes it moved since the last report; a step of it that ended
// (`done`) is a phase of the job: "pull", "push", or "push-verify".
void ApplyTransferProgress(Job& job, const std::string& phase, double seconds, uint64_t bytes, bool done);
// The transfer's account once it is over (REQUIRES: job.transfer).
void FinishTransfer(Job& job, const TransferResult& result);

// REQUIRES: job.state == kRunning. Ends the job.
void Succeed(Job& job, const std::string& now);
void Fail(Job& job, const std::string& error, const std::string& now);

// A running record left by an agent that died: failed, naming the phase and
// whether its snapshot (job.snapshot) had been published before the end.
Job Interrupted(Job job, bool snapshot_published, const std::string& now);

// The finished jobs of `jobs` beyond the `keep` that finished last (by
// `finished`, then `created`, then id: RFC 3339 times sort as text): the
// records to remove, so that the journal and the API keep a bounded number
// however long the agent runs. Running jobs are always kept.
std::vector<std::string> FinishedJobsBeyond(const std::map<std::string, Job>& jobs, size_t keep);

// The record as the journal and the API show it.
std::string JobToJson(const Job& job);
// kCorruption naming the field for a record that is not one of ours.
Result<Job> JobFromJson(std::string_view text);

}  // namespace gpusnap::agent
