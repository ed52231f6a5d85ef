// The slowest a transfer may go: at least `bytes_per_s` averaged over each
// window of `window_s` seconds. The read timeout alone lets a server that
// drips a byte now and then hold a pull (and an agent's job) for hours.
#pragma once

#include <cstdint>

namespace gpusnap::registry {

class RateFloor {
 public:
  RateFloor(uint64_t bytes_per_s, double window_s) : bytes_per_s_(bytes_per_s), window_s_(window_s) {}
  // `bytes` more arrived `now_s` seconds after the transfer began; false once
  // a whole window went by below the floor (0 bytes_per_s: never).
  bool Arrived(uint64_t bytes, double now_s) {
    in_window_ += bytes;
    if (now_s - window_start_s_ < window_s_) return true;
    bool fast_enough = double(in_window_) >= double(bytes_per_s_) * (now_s - window_start_s_);
    window_start_s_ = now_s;
    in_window_ = 0;
    return fast_enough;
  }

 private:
  uint64_t bytes_per_s_;
  double window_s_;
  double window_start_s_ = 0;
  uint64_t in_window_ = 0;
};

}  // namespace gpusnap::registry
