// Splitting text on a separator, as /proc's and the kernel's own formats
// (mountinfo fields, cgroup lines, option lists) are read.
#pragma once

#include <string_view>
#include <vector>

namespace gpusnap {

// Every piece between separators, empty ones included ("a::b" on ':' is
// "a", "", "b"); one piece for text without a separator. The views point
// into `text`.
inline std::vector<std::string_view> Split(std::string_view text, char separator) {
  std::vector<std::string_view> out;
  for (;;) {
    size_t at = text.find(separator);
    out.push_back(text.substr(0, at));
    if (at == std::string_view::npos) return out;
    text.remove_prefix(at + 1);
  }
}

}  // namespace gpusnap
