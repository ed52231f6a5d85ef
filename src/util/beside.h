// A piece of work on a thread of its own, beside a story's steps: its result
// and how long it took. The future's destructor waits for the thread: what
// the work captures by reference must outlive the future.
#pragma once

#include <chrono>
#include <future>
#include <utility>

namespace gpusnap {

template <typename T>
struct Timed {
  T value;
  double seconds = 0;
};

template <typename Fn>
auto Beside(Fn fn) {
  return std::async(std::launch::async, [fn = std::move(fn)] {
    auto t0 = std::chrono::steady_clock::now();
    auto value = fn();
    return Timed<decltype(value)>{std::move(value),
                                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
  });
}

}  // namespace gpusnap
