#include <cstdio>

#include "cli/cli.h"
#include "criu/bundle.h"
#include "store/store.h"
#include "util/byte_size.h"

namespace gpusnap::cli {

void AddSnapshots(CLI::App& app, Context& ctx) {
  auto store_path = std::make_shared<std::string>();
  const char* store_help = "Snapshot store (default $GPUSNAP_STORE or /var/lib/gpusnap)";
  // Through the node agent when one answers, unless a store other than its is named (docs/AGENT.md).
  auto agent = std::make_shared<AgentFlags>();

  auto* ls = app.add_subcommand("ls", "List snapshots");
  ls->add_option("--store", *store_path, store_help);
  AddAgentFlags(*ls, *agent);
  ls->callback([&ctx, ls, store_path, agent] {
    auto route = RouteCommand(ctx, *ls, *agent, *store_path, {});
    if (!route.ok()) return ctx.Fail(route.status());
    auto store = Store::Open(StoreOrDefault(*store_path), false);
    std::vector<SnapshotMeta> all;
    std::vector<std::string> warnings;
    if (route->through_agent) {
      auto listed = ListThroughAgent(route->socket);
      if (!listed.ok()) return ctx.Fail(listed.status());
      all = std::move(listed).value();
    } else if (store.ok()) {
      auto listed = store->List(&warnings);
      if (!listed.ok()) return ctx.Fail(listed.status());
      all = std::move(listed).value();
    } else if (store.status().code() != Code::kNotFound) {
      return ctx.Fail(store.status());
    }
    for (const auto& w : warnings) std::fprintf(stderr, "gpusnap: warning: %s\n", w.c_str());
    if (ctx.json) {
      nlohmann::json arr = nlohmann::json::array();
      for (const auto& m : all)
        arr.push_back({{"id", m.id}, {"created", m.created}, {"source", m.source.name}, {"total_bytes", m.total_bytes}});
      return ctx.PrintJson(arr);
    }
    std::printf("%-48s %-25s %-10s %s\n", "ID", "CREATED", "SIZE", "SOURCE");
    for (const auto& m : all)
      std::printf("%-48s %-25s %-10s %s\n", m.id.c_str(), m.created.c_str(), HumanBytes(m.total_bytes).c_str(),
                  m.source.name.empty() ? fmt::format("pid {}", m.source.host_pid).c_str() : m.source.name.c_str());
  });

  auto inspect_id = std::make_shared<std::string>();
  auto verify = std::make_shared<bool>(false);
  auto* inspect = app.add_subcommand("inspect", "Print a snapshot's metadata as JSON");
  inspect->add_option("id", *inspect_id, "Snapshot id")->required();
  inspect->add_option("--store", *store_path, store_help);
  inspect->add_flag("--verify", *verify, "Also check every file against its digest (in-process)");
  AddAgentFlags(*inspect, *agent);
  inspect->callback([&ctx, inspect, store_path, inspect_id, verify, agent] {
    auto route = RouteCommand(ctx, *inspect, *agent, *store_path, {"--verify"});
    if (!route.ok()) return ctx.Fail(route.status());
    if (route->through_agent) {
      auto meta = LoadThroughAgent(route->socket, *inspect_id);
      if (!meta.ok()) return ctx.Fail(meta.status());
      std::printf("%s", SnapshotMetaToJson(*meta).c_str());
      return;
    }
    auto store = Store::Open(StoreOrDefault(route->store.empty() ? *store_path : route->store), false);
    if (!store.ok()) return ctx.Fail(store.status());
    auto meta = store->Load(*inspect_id);
    if (!meta.ok()) return ctx.Fail(meta.status());
    if (*verify) {
      if (Status st = store->Verify(*meta); !st.ok()) return ctx.Fail(st);
      std::fprintf(stderr, "[inspect] %s: all %zu files match their digests\n", inspect_id->c_str(), meta->files.size());
    }
    std::printf("%s", SnapshotMetaToJson(*meta).c_str());
  });

  auto rm_ids = std::make_shared<std::vector<std::string>>();
  auto* rm = app.add_subcommand("rm", "Remove snapshots");
  rm->add_option("id", *rm_ids, "Snapshot ids")->required();
  rm->add_option("--store", *store_path, store_help);
  AddAgentFlags(*rm, *agent);
  rm->callback([&ctx, rm, store_path, rm_ids, agent] {
    auto route = RouteCommand(ctx, *rm, *agent, *store_path, {});
    if (!route.ok()) return ctx.Fail(route.status());
    if (route->through_agent) {
      for (const auto& id : *rm_ids) {
        if (Status st = RemoveThroughAgent(route->socket, id); !st.ok()) return ctx.Fail(st);
        if (!ctx.json) std::printf("%s\n", id.c_str());
      }
      return ctx.PrintJson({{"removed", *rm_ids}});
    }
    uint64_t chunks = 0, chunk_bytes = 0, cached = 0, cached_bytes = 0;
    std::vector<std::string> warnings;
    for (const auto& id : *rm_ids) {
      auto removed = RemoveSnapshot(StoreOrDefault(*store_path), id);
      if (!removed.ok()) return ctx.Fail(removed.status());
      chunks += removed->chunks.removed.size();
      chunk_bytes += removed->chunks.removed_bytes;
      if (removed->chunks_status.ok()) {  // what the store keeps after the last collection
        cached = removed->chunks.cached_chunks;
        cached_bytes = removed->chunks.cached_bytes;
      }
      if (!removed->chunks_status.ok()) {
        warnings.push_back(removed->chunks_status.message());
        std::fprintf(stderr, "gpusnap: warning: %s\n", warnings.back().c_str());
      }
      if (!ctx.json) std::printf("%s\n", id.c_str());
    }
    if (chunks > 0 && !ctx.json && !ctx.quiet)
      std::fprintf(stderr, "[rm] removed %llu chunk file(s) no snapshot names any more (%s)\n",
                   static_cast<unsigned long long>(chunks), HumanBytes(chunk_bytes).c_str());
    if (cached > 0 && !ctx.json && !ctx.quiet)
      std::fprintf(stderr, "[rm] kept %llu chunk(s) no snapshot names (%s), within the store's chunk_cache_bytes\n",
                   static_cast<unsigned long long>(cached), HumanBytes(cached_bytes).c_str());
    ctx.PrintJson({{"removed", *rm_ids}, {"chunks_removed", chunks}, {"chunk_bytes_removed", chunk_bytes},
                   {"chunks_cached", cached}, {"chunk_bytes_cached", cached_bytes}, {"warnings", warnings}});
  });

  auto gc_options = std::make_shared<GcOptions>();
  auto gc_wait_s = std::make_shared<int>(0);
  auto gc_keep_unused = std::make_shared<std::string>();
  auto* gc = app.add_subcommand("gc", "Delete the gpushare chunks no snapshot names any more");
  gc->add_option("--store", *store_path, store_help);
  gc->add_flag("--dry-run", gc_options->dry_run, "List what would be deleted and its bytes; delete nothing");
  gc->add_option("--wait-s", *gc_wait_s, "How long to wait for checkpoints that are writing chunks (default 0)")
      ->check(CLI::Range(0, 86400));
  gc->add_option("--keep-unused", *gc_keep_unused,
                 "Keep up to BYTES (512M, 20G, 1T: binary units) of the chunks no snapshot names, the most "
                 "recently used (default: the store's chunk_cache_bytes, else 0)")
      ->type_name("BYTES")
      ->check([](const std::string& given) {
        auto bytes = ParseByteSize(given);
        return bytes.ok() ? std::string() : bytes.status().message();
      });
  gc->footer(
      "Chunks that no manifest names (of a snapshot, a snapshot being written, a process suspended in place), and\n"
      "temporary files of chunk writes interrupted over an hour ago. A manifest that cannot be read stops it\n"
      "before anything is deleted.\n"
      "\n"
      "With a limit (--keep-unused, or {\"chunk_cache_bytes\": N} in <store>/config.json, which `rm` follows\n"
      "too), unreferenced chunks are a cache for later pulls and checkpoints: the least recently used go until\n"
      "the rest total at most the limit. A chunk is used when it is written, loaded by a restore or a resume,\n"
      "or found present by a checkpoint or a pull. Chunks a snapshot names never go and do not count.");
  gc->callback([&ctx, store_path, gc_options, gc_wait_s, gc_keep_unused] {
    GcOptions options = *gc_options;
    options.store = StoreOrDefault(*store_path);
    options.wait_ms = *gc_wait_s * 1000;
    if (!gc_keep_unused->empty()) {
      auto bytes = ParseByteSize(*gc_keep_unused);  // checked when parsed
      if (!bytes.ok()) return ctx.Fail(bytes.status());
      options.keep_unused_bytes = *bytes;
    }
    auto r = CollectGarbage(options);
    if (!r.ok()) return ctx.Fail(r.status());
    if (ctx.json) {
      nlohmann::json items = nlohmann::json::array();
      for (const auto& i : r->removed) items.push_back({{"path", i.path}, {"bytes", i.bytes}, {"reason", i.reason}});
      return ctx.PrintJson({{"dry_run", options.dry_run}, {"removed", items}, {"removed_bytes", r->removed_bytes},
                            {"kept_chunks", r->kept_chunks}, {"kept_bytes", r->kept_bytes},
                            {"cached_chunks", r->cached_chunks}, {"cached_bytes", r->cached_bytes},
                            {"keep_unused_bytes", r->keep_unused_bytes}, {"manifests", r->manifests}});
    }
    const char* verb = options.dry_run ? "would remove" : "removed";
    for (const auto& i : r->removed)
      std::printf("%s %s (%s, %s)\n", verb, i.path.c_str(), HumanBytes(i.bytes).c_str(), i.reason.c_str());
    std::printf("%s %zu file(s), %s; kept %llu chunk(s), %s, named by %llu manifest(s)\n", verb, r->removed.size(),
                HumanBytes(r->removed_bytes).c_str(), static_cast<unsigned long long>(r->kept_chunks),
                HumanBytes(r->kept_bytes).c_str(), static_cast<unsigned long long>(r->manifests));
    if (r->keep_unused_bytes > 0)
      std::printf("%s %llu unreferenced chunk(s), %s, within the limit of %s\n", options.dry_run ? "would keep" : "kept",
                  static_cast<unsigned long long>(r->cached_chunks), HumanBytes(r->cached_bytes).c_str(),
                  HumanBytes(r->keep_unused_bytes).c_str());
  });
}

void AddVersion(CLI::App& app, Context& ctx) {
  auto criu_dir = std::make_shared<std::string>();
  auto* sub = app.add_subcommand("version", "Print gpusnap's version and the CRIU it uses");
  sub->add_option("--criu", *criu_dir, "CRIU bundle directory (default: found next to gpusnap)");
  sub->callback([&ctx, criu_dir] {
    nlohmann::json j = {{"gpusnap", GPUSNAP_VERSION}};
    auto bundle = criu::FindBundle(*criu_dir);
    if (bundle.ok()) {
      j["criu"] = {{"bundle", bundle->dir}, {"version", bundle->version_line}};
      auto features = criu::DetectFeatures(*bundle, true);
      if (features.ok()) {
        j["criu"]["runtime_version"] = fmt::format("{}.{}", features->version_major, features->version_minor);
        j["criu"]["features"] = {{"network_lock_nftables", features->nftables}};
      } else {
        j["criu"]["error"] = features.status().message();
      }
    } else {
      j["criu"] = {{"error", bundle.status().message()}};
    }
    if (ctx.json) return ctx.PrintJson(j);
    std::printf("gpusnap %s\n", GPUSNAP_VERSION);
    if (bundle.ok())
      std::printf("criu: %s (bundle %s)\n", bundle->version_line.c_str(), bundle->dir.c_str());
    else
      std::printf("criu: not found: %s\n", bundle.status().message().c_str());
    if (!bundle.ok()) ctx.exit_code = 1;
  });
}

}  // namespace gpusnap::cli
