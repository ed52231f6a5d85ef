// CRIU's lazy pages (`criu restore --lazy-pages` with a `criu lazy-pages`
// daemon): the restore maps the tree's private anonymous memory without
// filling it and hands each task's userfaultfd to the daemon, which serves
// the pages the tree faults on and copies the rest in the background, then
// exits. The two find each other through a unix socket, `lazy-pages.socket`,
// in their common work directory (both chdir to it; the name is relative).
//
// The decisions are pure (the daemon's argv, the verdict on the node's
// support), so they are unit-tested without CRIU; CheckLazyPages runs the
// check.
#pragma once

#include <string>
#include <vector>

#include "criu/bundle.h"
#include "gpusnap/status.h"

namespace gpusnap::criu {

inline constexpr const char* kLazyPagesSocket = "lazy-pages.socket";  // in the work dir, CRIU's own name
inline constexpr const char* kLazyPagesLog = "lazy-pages.log";         // the daemon's log, in the work dir

struct LazyPagesPlan {
  std::string images_dir;  // REQUIRES: absolute; the snapshot's CRIU images
  std::string work_dir;    // REQUIRES: absolute; the restore's work dir too (the socket is found there)
  int status_fd = -1;      // REQUIRES: >= 0, inherited; CRIU writes one byte when it listens
  bool verbose = false;
};

// Pure. The daemon's arguments after the criu binary (Bundle::Argv adds it):
// in the foreground (its parent sees it end and how), its log in the work dir.
std::vector<std::string> LazyPagesArgs(const LazyPagesPlan& plan);

// Pure. The verdict on `criu check --feature uffd-noncoop` (exit status and
// output): OK when it is supported, else kNotSupported naming what the node
// lacks (userfaultfd, with the non-cooperative events a process tree needs).
Status LazyPagesVerdict(const Captured& check);

// Runs the check with `bundle`.
Status CheckLazyPages(const Bundle& bundle);

}  // namespace gpusnap::criu
