// Where an HTTP/1.1 request's head (its request line and header lines) ends
// in the bytes read from a connection: what lets the agent bound the head's
// size apart from the body's. Pure: it only looks at the bytes it is fed.
//
// The head ends at the first empty line, "\r\n" right after the line
// before it ended; a line ending in a bare "\n" is no empty line (cpp-httplib
// skips such lines, as this does).
#pragma once

#include <cstddef>
#include <string_view>

namespace gpusnap::agent {

class RequestHeadScanner {
 public:
  // Feeds the next bytes of the request; returns how many of them belong to
  // the head (all of them until it ends, then up to and including its last
  // "\n"; 0 once it has ended).
  size_t Feed(std::string_view bytes);
  bool complete() const { return complete_; }
  size_t head_bytes() const { return head_bytes_; }  // the head's bytes fed so far

 private:
  size_t head_bytes_ = 0;
  size_t line_length_ = 0;  // bytes of the current line so far
  bool line_starts_with_cr_ = false;
  bool complete_ = false;
};

}  // namespace gpusnap::agent
