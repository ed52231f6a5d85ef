#include "criu/lazy_pages.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace gpusnap::criu {
namespace {

LazyPagesPlan SomePlan() {
  LazyPagesPlan p;
  p.images_dir = "/store/snapshots/s1/checkpoint";
  p.work_dir = "/run/gpusnap/lazy-pages/w-1";
  p.status_fd = 5;
  return p;
}

// The value after `flag`, or "" when the flag is absent.
std::string After(const std::vector<std::string>& args, const std::string& flag) {
  auto it = std::find(args.begin(), args.end(), flag);
  return it == args.end() || it + 1 == args.end() ? "" : *(it + 1);
}

TEST(LazyPagesArgs, ServesTheSnapshotsImagesFromTheRestoresWorkDir) {
  auto args = LazyPagesArgs(SomePlan());
  ASSERT_FALSE(args.empty());
  EXPECT_EQ(args[0], "lazy-pages");
  EXPECT_EQ(After(args, "--images-dir"), "/store/snapshots/s1/checkpoint");
  EXPECT_EQ(After(args, "--work-dir"), "/run/gpusnap/lazy-pages/w-1");
  EXPECT_EQ(After(args, "--status-fd"), "5");
  // A name inside the work dir, where CRIU writes it.
  EXPECT_EQ(After(args, "--log-file"), kLazyPagesLog);
}

TEST(LazyPagesArgs, StaysInTheForegroundSoItsParentSeesItEnd) {
  auto args = LazyPagesArgs(SomePlan());
  for (const char* daemonize : {"-d", "--daemon", "--pidfile"})
    EXPECT_EQ(std::find(args.begin(), args.end(), daemonize), args.end()) << daemonize;
}

TEST(LazyPagesArgs, LogLevelIsQuietUnlessVerbose) {
  LazyPagesPlan p = SomePlan();
  auto quiet = LazyPagesArgs(p);
  EXPECT_NE(std::find(quiet.begin(), quiet.end(), "-v2"), quiet.end());
  p.verbose = true;
  auto verbose = LazyPagesArgs(p);
  EXPECT_NE(std::find(verbose.begin(), verbose.end(), "-v4"), verbose.end());
}

TEST(LazyPagesVerdict, SupportedWhenTheCheckPasses) {
  EXPECT_TRUE(LazyPagesVerdict({.exit_status = 0, .output = "uffd-noncoop is supported\n"}).ok());
}

TEST(LazyPagesVerdict, NamesWhatTheNodeLacks) {
  Status st = LazyPagesVerdict({.exit_status = 1, .output = "UFFD is not supported\n"});
  EXPECT_EQ(st.code(), Code::kNotSupported);
  EXPECT_NE(st.message().find("userfaultfd"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("uffd-noncoop"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("UFFD is not supported"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("without --lazy-pages"), std::string::npos) << st.message();
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << "one line";
}

}  // namespace
}  // namespace gpusnap::criu
