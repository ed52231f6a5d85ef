#include "snapshot/restore_turn.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "criu/ghost_files.h"
#include "gpusnap/workload.h"
#include "util/files.h"

namespace gpusnap {

namespace {

constexpr auto kPoll = std::chrono::milliseconds(50);

// What the holder wrote of itself, for the restores that wait ("" when it
// has not yet, or the file is gone).
std::string Holder(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return "";
  std::string s = *text;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Removes what a killed restore left of the ghosts these images make.
void RemoveLeftovers(const RestoreTurnSpec& spec) {
  auto say = [&spec](const std::string& line) {
    if (spec.progress) spec.progress({"wait-turn: " + line, 0, 0, false});
  };
  auto ghosts = criu::ReadGhostFiles(spec.images_dir);
  if (!ghosts.ok()) {
    say(fmt::format("not looking for ghost files a killed restore left: {}", ghosts.status().message()));
    return;
  }
  for (const auto& g : *ghosts) {
    if (g.directory) continue;  // at the path itself: not told from the tree's own directory
    std::string path = spec.root + g.RestorePath();
    struct stat st{};
    if (::lstat(path.c_str(), &st) != 0) continue;
    if (::unlink(path.c_str()) == 0)
      say(fmt::format("removed `{}`, left by a restore killed while CRIU ran", g.RestorePath()));
    else
      say(fmt::format("cannot remove `{}`, left by a restore killed while CRIU ran: {}", g.RestorePath(),
                      Status::ErrnoText(errno)));
  }
}

}  // namespace

bool NeedsRestoreTurn(const std::vector<std::string>& image_names) {
  for (const auto& n : image_names)
    if (n.size() > 15 && n.starts_with("ghost-file-") && n.ends_with(".img")) return true;
  return false;
}

Result<RestoreTurn> TakeRestoreTurn(const RestoreTurnSpec& spec, Phases& phases) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(spec.images_dir, ec)) names.push_back(e.path().filename());
  if (ec) return Status::Error(Code::kIoError, "listing the CRIU images in `{}`: {}", spec.images_dir, ec.message());
  RestoreTurn turn;
  if (!NeedsRestoreTurn(names)) return turn;

  phases.Start("wait-turn");
  std::string dir = RunDir() + "/locks";
  GPUSNAP_RETURN_IF_ERROR(MakeDirs(dir, 0700));
  std::string path = dir + "/criu-ghosts.lock";
  auto deadline = std::chrono::steady_clock::now() + spec.timeout;
  bool told = false;
  for (;;) {
    auto lock = LockFile::TryAcquire(path);
    if (lock.ok()) {
      turn.lock_ = std::move(*lock);
      break;
    }
    if (lock.status().code() != Code::kAlreadyExists) return lock.status();
    std::string holder = Holder(path);
    if (!told && spec.progress) {
      spec.progress({fmt::format("wait-turn: waiting for the restore at CRIU ({}): restores of images that hold "
                                 "deleted files take turns there",
                                 holder.empty() ? "starting" : holder),
                     0, 0, false});
      told = true;
    }
    if (std::chrono::steady_clock::now() >= deadline)
      return Status::Error(Code::kTimeout, "waited {} s for the turn at CRIU, held by the restore ({}) in `{}`: "
                           "restores of images that hold deleted files take turns there",
                           spec.timeout.count(), holder.empty() ? "unnamed" : holder, path);
    std::this_thread::sleep_for(kPoll);
  }
  // Named for the restores that wait; best effort, the flock is the turn.
  std::string me = fmt::format("pid {}, snapshot {}\n", ::getpid(), spec.snapshot_id);
  if (::ftruncate(turn.lock_->fd(), 0) == 0) (void)!::pwrite(turn.lock_->fd(), me.data(), me.size(), 0);
  RemoveLeftovers(spec);
  phases.Done();
  return turn;
}

}  // namespace gpusnap
