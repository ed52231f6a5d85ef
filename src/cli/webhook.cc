#include "cli/cli.h"
#include "k8s/snapshot_lookup.h"
#include "k8s/webhook_server.h"

namespace gpusnap::cli {

void AddWebhook(CLI::App& app, Context& ctx) {
  auto* sub = app.add_subcommand("webhook", "Serve the Kubernetes mutating admission webhook (HTTPS)");
  auto opts = std::make_shared<k8s::WebhookOptions>();
  k8s::MutateConfig& m = opts->mutate;
  sub->add_option("--cert", opts->cert_file, "TLS certificate (PEM; read again when it changes)")->required();
  sub->add_option("--key", opts->key_file, "TLS private key (PEM; read again when it changes)")->required();
  sub->add_option("--listen", opts->listen, "HOST:PORT, [V6]:PORT or :PORT (0: any free port)")->capture_default_str();
  sub->add_option("--bundle-host-path", m.bundle_host_path, "The node's gpusnap bundle")->capture_default_str();
  sub->add_option("--bundle-mount-path", m.bundle_mount_path, "Where containers see the bundle")->capture_default_str();
  sub->add_option("--shim", m.shim_path, "The gpushare shim, as containers see it")->capture_default_str();
  sub->add_option("--chunk-store-host-path", m.chunk_store_host_path, "Per-pod chunk stores on the node")
      ->capture_default_str();
  sub->add_option("--chunk-store-mount-path", m.chunk_store_mount_path, "Where containers see their chunk store")
      ->capture_default_str();
  sub->add_option("--reaper-command", m.reaper_command, "A placeholder's pid 1 (as containers see it)")
      ->capture_default_str()
      ->expected(1, 16);
  auto lookup_store = std::make_shared<std::string>();
  sub->add_option("--snapshot-lookup-store", *lookup_store,
                  "A gpusnap store this process can read, for the GPU count of snapshots whose pods do not give "
                  "gpusnap.io/gpu-count (default: none, count 1)");
  sub->add_option("--max-body-bytes", opts->max_body_bytes, "Larger requests get 413")->capture_default_str();
  sub->add_option("--timeout", opts->io_timeout_s, "Seconds a read or write may take")->capture_default_str();
  sub->add_option("--threads", opts->threads, "Worker threads")->capture_default_str();
  sub->footer("Logs one line per review on stderr; stops on SIGINT or SIGTERM.");
  sub->callback([&ctx, opts, lookup_store] {
    if (!lookup_store->empty()) opts->mutate.snapshot_gpu_count = k8s::StoreGpuCountLookup(*lookup_store);
    Status st = k8s::RunWebhook(*opts);
    if (!st.ok()) ctx.Fail(st);
  });
}

}  // namespace gpusnap::cli
