// `gpusnap restore --huge-pages`: the host's transparent huge pages set to
// `always` while CRIU restores, the host's own mode put back after. CRIU then
// restores a large image in huge pages (docs/BENCHMARK.md: CRIU 1.8 s against
// 2.3-2.4 s for the 8B-class server's 3.1 GiB image under `madvise`).
//
// The setting is the host's, so restores that overlap share one window: each
// holds a lock file <dir>/holder-<pid>-<n> while it is open; the first to open
// saves the host's mode in <dir>/saved and sets `always`, the last to close
// writes the saved mode back. A holder that died leaves a file nobody locks,
// which the next open or close removes; a window left open by a crash is
// closed by the next restore that opens and closes one.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "gpusnap/status.h"
#include "util/lock_file.h"

namespace gpusnap::host {

// $GPUSNAP_THP_FILE (tests), else /sys/kernel/mm/transparent_hugepage/enabled.
std::string ThpFile();

// Pure. The mode a THP file names: the word in brackets of
// "always [madvise] never", or the text itself, trimmed.
std::string ThpMode(std::string_view text);

class HugePagesWindow {
 public:
  // `thp_file`: the host's THP setting; `dir`: where the windows keep their state.
  static Result<HugePagesWindow> Open(const std::string& thp_file, const std::string& dir);

  HugePagesWindow(HugePagesWindow&&) noexcept = default;
  HugePagesWindow& operator=(HugePagesWindow&&) noexcept = default;
  ~HugePagesWindow() { (void)Close(); }

  // Idempotent. The last window open puts the host's mode back.
  Status Close();

 private:
  HugePagesWindow(std::string thp_file, std::string dir, LockFile holder)
      : thp_file_(std::move(thp_file)), dir_(std::move(dir)), holder_(std::move(holder)) {}
  std::string thp_file_, dir_;
  std::optional<LockFile> holder_;
};

}  // namespace gpusnap::host
