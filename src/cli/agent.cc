#include <cstdlib>

#include "agent/client/route.h"
#include "agent/server/http_server.h"
#include "chunks/chunk_store.h"
#include "cli/cli.h"
#include "util/byte_size.h"

namespace gpusnap::cli {

void AddAgent(CLI::App& app, Context& ctx) {
  auto* sub = app.add_subcommand("agent", "Serve the node agent's HTTP API (docs/AGENT.md)");
  auto opts = std::make_shared<agent::AgentOptions>();
  if (const char* socket = std::getenv(agent::kAgentSocketEnv); socket && *socket) opts->socket_path = socket;
  sub->add_option("--socket", opts->socket_path, "Unix socket (mode 0600; root only; default $GPUSNAP_AGENT_SOCKET)")
      ->capture_default_str();
  sub->add_option("--listen", opts->listen, "Also serve TCP on HOST:PORT or :PORT (needs --token-file)");
  sub->add_option("--allow-uid", opts->allowed_uids,
                  "Besides root, a uid that may call on the unix socket (repeatable; the socket becomes mode 0666 and "
                  "each caller's uid is checked)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--token-file", opts->token_file, "Bearer token for TCP callers (a file of mode 0600)");
  sub->add_option("--store", opts->service.store, "Snapshot store (default: $GPUSNAP_STORE or /var/lib/gpusnap)");
  sub->add_option("--state-dir", opts->service.state_dir, "Job journal and lock (default: <store>/agent)");
  sub->add_option("--criu", opts->service.criu_bundle, "CRIU bundle directory (default: found)");
  sub->add_option("--kubelet-log-dir", opts->service.kubelet_log_dir,
                  "The kubelet's container log links, to find a pod's container")
      ->capture_default_str();
  sub->add_option("--timeout", opts->service.operation_timeout_s, "Seconds a checkpoint or restore may take")
      ->capture_default_str();
  sub->add_flag("--huge-pages", opts->service.huge_pages,
                "Every restore it runs sets the host's transparent huge pages to `always` while CRIU restores, as "
                "`gpusnap restore --huge-pages` does (docs/RESTORE-OPTIONS.md)");
  sub->add_option("--max-job-records", opts->service.max_job_records,
                  "Finished job records kept, the newest (older ones are removed as jobs end)")
      ->check(CLI::Range(size_t{1}, size_t{1000000}))
      ->capture_default_str();
  // Parsed here, once, into the bytes the service takes.
  sub->add_option_function<std::string>(
         "--pinned-cache",
         [opts](const std::string& given) {
           auto bytes = ParseByteSize(given);
           if (!bytes.ok()) throw CLI::ValidationError("--pinned-cache", bytes.status().message());
           if (*bytes != 0 && *bytes < chunks::kChunkBytes)
             throw CLI::ValidationError(
                 "--pinned-cache", fmt::format("--pinned-cache {} holds not one chunk ({} bytes): give 0 or at "
                                               "least 64MiB", given, chunks::kChunkBytes));
           opts->service.pinned_cache_bytes = *bytes;
         },
         "Keep gpushare chunks in up to SIZE of pinned host memory (64GiB, 512M: binary units; 0: none, the "
         "default): a standby's when it is made, a snapshot's on `gpusnap warm`, recently read ones otherwise; "
         "wakes and restores copy them to the GPU from there (docs/AGENT.md)")
      ->type_name("SIZE");
  sub->add_option("--max-body-bytes", opts->max_body_bytes, "Larger requests get 413")->capture_default_str();
  sub->add_option("--threads", opts->threads, "HTTP worker threads per listener")->capture_default_str();
  sub->add_option("--io-timeout", opts->io_timeout_s,
                  "Seconds a request's head and body may take to arrive (then 408), and one read or write")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  sub->add_option("--max-connections", opts->max_connections,
                  "Connections a listener holds, served or waiting (past it: 503); 0: no limit")
      ->capture_default_str();
  sub->add_option("--max-connections-per-peer", opts->max_connections_per_peer,
                  "TCP connections served at once from one address (past it: 503); 0: no limit")
      ->capture_default_str();
  sub->add_flag("--kube", opts->kube.enabled,
                "Restore the placeholder pods of this node from the Kubernetes API server (docs/KUBERNETES.md)");
  sub->add_option("--node-name", opts->kube.node_name, "This node's name, for --kube (default: $NODE_NAME)");
  sub->add_option("--kubeconfig", opts->kube.kubeconfig,
                  "The API server from this kubeconfig, for --kube (default: the pod's service account)");
  AddRegistryFlags(*sub, opts->registry.access);
  AddTrustFlags(*sub, opts->registry.access);
  AddRegistriesConfFlag(*sub, opts->registry.access);
  AddDecryptionKeyFlag(*sub, opts->registry.access);
  auto encryption = AddEncryptionFlags(*sub);
  sub->add_option("--registry-secret", opts->registry.secret,
                  "Registry credentials from this Secret (NAMESPACE/NAME, type kubernetes.io/dockerconfigjson), "
                  "read through the API server; for --kube, instead of --registry-config");
  sub->add_option("--tenancy", opts->tenancy_file,
                  "For --kube: the administrator's tenancy rules, a JSON file read at each use: which namespaces' "
                  "snapshots a namespace may restore, which repositories it may use and with whose credentials "
                  "(docs/SECURITY.md); default: each namespace its own snapshots, no registry");
  sub->footer("Logs one line per job on stderr; stops on SIGINT or SIGTERM after running jobs finish. Restores of a "
              "registry reference and checkpoints with pushTo reach the registry with the --registry-* settings, "
              "--ca-file and --plain-http, and --decryption-key and --encryption-key (docs/AGENT.md); a pod's "
              "namespace uses its own keys instead (docs/SECURITY.md).");
  sub->callback([&ctx, opts, encryption] {
    if (const char* node = std::getenv("NODE_NAME"); opts->kube.node_name.empty() && node) opts->kube.node_name = node;
    auto keys = encryption();
    if (!keys.ok()) return ctx.Fail(keys.status());
    opts->service.encryption = std::move(keys).value();
    Status st = agent::RunAgent(*opts);
    if (!st.ok()) ctx.Fail(st);
  });
}

}  // namespace gpusnap::cli
