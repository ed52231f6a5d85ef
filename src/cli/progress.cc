#include "cli/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace gpusnap::cli {

namespace {

bool StderrIsTerminal() {
  const char* term = std::getenv("TERM");
  return ::isatty(STDERR_FILENO) == 1 && !(term && std::strcmp(term, "dumb") == 0);
}

int TerminalColumns() {
  winsize ws{};
  return ::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 ? ws.ws_col : 0;
}

// Straight to the descriptor: no stdio lock is ever held by the ticker.
void WriteStderr(const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(STDERR_FILENO, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

}  // namespace

ProgressDisplay::ProgressDisplay(const Context& ctx, std::string operation)
    : mode_(ctx.quiet || ctx.json ? Mode::kNone : StderrIsTerminal() ? Mode::kBar : Mode::kLines),
      started_(std::chrono::steady_clock::now()) {
  state_.operation = std::move(operation);
  if (mode_ != Mode::kBar) return;
  MutexLock lock(mu_);
  Draw();
  ticker_ = std::thread([this] {
    MutexLock ticking(mu_);
    while (!ended_) {
      ticking.WaitFor(wake_, std::chrono::milliseconds(200));
      if (!ended_) Draw();
    }
  });
}

ProgressDisplay::~ProgressDisplay() { Finish(false); }

ProgressFn ProgressDisplay::Fn() {
  if (mode_ == Mode::kNone) return nullptr;
  return [this](const ProgressEvent& e) { Event(e); };
}

void ProgressDisplay::Event(const ProgressEvent& e) {
  if (mode_ == Mode::kNone) return;
  MutexLock lock(mu_);
  if (ended_) return;
  if (mode_ == Mode::kLines) {
    std::string bytes = e.bytes ? fmt::format(", {}", HumanBytes(e.bytes)) : "";
    WriteStderr(fmt::format("[{}] {} {} ({:.2f} s{})\n", state_.operation, e.phase, e.done ? "done" : "...",
                            e.seconds, bytes));
    return;
  }
  state_.bytes_done += e.bytes;
  if (e.done) {
    state_.phase = e.phase;
    state_.percent = PhasePercent(state_.operation, e.phase, state_.percent);
  }
  Draw();
}

void ProgressDisplay::SetBytesTotal(uint64_t total) {
  MutexLock lock(mu_);
  state_.bytes_total = total;
}

void ProgressDisplay::Finish(bool ok) {
  {
    MutexLock lock(mu_);
    if (ended_) return;
    ended_ = true;
    if (mode_ == Mode::kBar) {
      state_.end = ok ? BarState::End::kSucceeded : BarState::End::kFailed;
      Draw();
      WriteStderr("\n");
    }
  }
  wake_.notify_all();
  if (ticker_.joinable()) ticker_.join();
}

void ProgressDisplay::Draw() {
  state_.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  // "\r" back to the line's start; ESC [ K clears what a longer line left.
  WriteStderr("\r" + FormatProgressBar(state_, TerminalColumns()) + "\x1b[K");
}

}  // namespace gpusnap::cli
