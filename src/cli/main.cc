#include <cstring>

#include "cli/cli.h"
#include "cli/usage.h"
#include "criu/lazy_pages_keeper.h"
#include "ns/reaper.h"

int main(int argc, char** argv) {
  // The namespace reaper, a container's placeholder and a lazy restore's keeper are this binary too; they take no
  // part in the CLI.
  if (argc > 1 && std::strcmp(argv[1], "__reaper") == 0) return gpusnap::ns::ReaperMain(argc - 2, argv + 2);
  if (argc > 1 && std::strcmp(argv[1], "__placeholder") == 0) return gpusnap::ns::PlaceholderMain(argc - 2, argv + 2);
  // The keeper of a --lazy-pages restore's page server (criu/lazy_pages_keeper.h).
  if (argc > 1 && std::strcmp(argv[1], "__lazy-pages") == 0)
    return gpusnap::criu::LazyPagesKeeperMain(argc - 2, argv + 2);

  CLI::App app{"gpusnap: checkpoint and restore (GPU) process trees with CRIU"};
  app.require_subcommand(1);
  app.fallthrough();  // --json and --quiet also after the subcommand
  gpusnap::cli::Context ctx;
  app.add_flag("--json", ctx.json, "Print results as JSON");
  app.add_flag("-q,--quiet", ctx.quiet, "No progress lines");
  gpusnap::cli::AddRun(app, ctx);
  gpusnap::cli::AddPs(app, ctx);
  gpusnap::cli::AddCheckpoint(app, ctx);
  gpusnap::cli::AddRestore(app, ctx);
  gpusnap::cli::AddWake(app, ctx);
  gpusnap::cli::AddWarm(app, ctx);
  gpusnap::cli::AddKill(app, ctx);
  gpusnap::cli::AddSnapshots(app, ctx);
  gpusnap::cli::AddRegistry(app, ctx);
  gpusnap::cli::AddVersion(app, ctx);
  gpusnap::cli::AddWebhook(app, ctx);
  gpusnap::cli::AddAgent(app, ctx);
  gpusnap::cli::AddCuda(app, ctx);
  gpusnap::cli::AddGpushare(app, ctx);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& help) {  // --help
    return app.exit(help);
  } catch (const CLI::ParseError& usage) {
    return gpusnap::cli::ReportUsageError(app, usage);
  }
  return ctx.exit_code;
}
