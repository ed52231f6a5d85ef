// The agent's Kubernetes mode (`gpusnap agent --kube`): it watches the
// placeholder pods of its node on the API server and restores each one's
// snapshot into its placeholder container, as a job of the agent's Service
// (journaled, listed in /v1/jobs, counted in the metrics), then records the
// result on the pod: annotations (agent/kube/placeholder_pods.h) and an Event.
//
// The watch: a list of the pods with label gpusnap.io/placeholder=true and
// spec.nodeName=<node>, then a watch from the list's resourceVersion, resumed
// from the last resourceVersion seen when it ends or breaks. A resourceVersion
// the server no longer has (410) makes it list again. Errors are retried
// after a pause that doubles from retry_initial_s up to retry_max_s, and
// starts again once the server answers.
//
// Each pod goes through DecidePod. A restore is claimed on the pod first
// (restore-status=restoring, with the pod's resourceVersion as precondition)
// and only then started; a claim that does not go through starts nothing. A
// restore refused because another job holds its snapshot or container (a
// second pod restoring the same snapshot) starts once that job is done. A
// failed restore is recorded and left: it is not retried. Recording is
// retried until the API server takes it (or the pod is gone).
//
// Threads: one watches, one works (decides, claims, starts jobs, follows
// them, records); the watcher hands pods to the worker in order.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "agent/service/service.h"
#include "gpusnap/status.h"

namespace gpusnap::agent {

struct KubeOptions {
  bool enabled = false;
  std::string node_name;       // REQUIRES when enabled: this node's name (spec.nodeName of its pods)
  std::string kubeconfig;      // a kubeconfig file; empty: the pod's service account (in-cluster)
  int watch_timeout_s = 300;   // how long one watch request lasts before it is made again
  double retry_initial_s = 0.5;
  double retry_max_s = 30;
};

class PlaceholderWatcher {
 public:
  // Reads the API server's configuration and starts watching; the first
  // list happens on the watch thread (an API server that is down is retried).
  // kInvalidArgument for options that cannot work (no node name), or the
  // configuration's errors (kubeconfig.h).
  static Result<std::unique_ptr<PlaceholderWatcher>> Start(const KubeOptions& options, Service& service,
                                                           std::function<void(const std::string&)> log);
  // Stop().
  ~PlaceholderWatcher();

  // Ends the watch and starts no more restores; waits for the restores in
  // flight to finish and records them, one attempt each (an agent started
  // later records what is left: kRecover). Idempotent.
  void Stop();

 private:
  struct Impl;
  explicit PlaceholderWatcher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpusnap::agent
