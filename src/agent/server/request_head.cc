#include "agent/server/request_head.h"

namespace gpusnap::agent {

size_t RequestHeadScanner::Feed(std::string_view bytes) {
  size_t taken = 0;
  while (!complete_ && taken < bytes.size()) {
    char c = bytes[taken++];
    ++head_bytes_;
    if (line_length_ == 0) line_starts_with_cr_ = c == '\r';
    ++line_length_;
    if (c != '\n') continue;
    // "\r\n" alone, after the request line: the head is over.
    if (line_length_ == 2 && line_starts_with_cr_ && head_bytes_ > 2) complete_ = true;
    line_length_ = 0;
  }
  return taken;
}

}  // namespace gpusnap::agent
