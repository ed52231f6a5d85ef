// One exchange over a gpushare control socket (protocol.h): a request line
// out, with an fd passed alongside if given, and a reply line back, with the
// fd the process passed alongside it, if any. Used by gpusnap (tree.h) and by
// the shim itself, whose cuIpcOpenMemHandle asks the exporting process for an
// fd of its memory.
#pragma once

#include <string>

#include "gpusnap/status.h"
#include "util/fd.h"

namespace gpusnap::gpushare {

struct ControlExchange {
  std::string reply;   // the reply line, without its newline
  UniqueFd passed_fd;  // what the process passed with its reply, if anything
};

// kTimeout when no reply comes within `timeout_ms`; Errno-style errors name
// what failed (`what` says for whom, as in "gpushare `state` of pid 7").
Result<ControlExchange> ExchangeControlLine(const std::string& socket_name, const std::string& line, int timeout_ms,
                                            int send_fd, const std::string& what);

// sendmsg of `data` with `fd` (when >= 0) passed in the first piece; the rest
// sent plainly. False with errno set on failure.
bool SendWithFd(int sock, const std::string& data, int fd);
// recvmsg into `buf`; a passed fd (close-on-exec) lands in `fd` (closed
// first if it held one). The bytes read, 0 at the end, -1 with errno.
long RecvWithFd(int sock, char* buf, size_t len, UniqueFd& fd);

}  // namespace gpusnap::gpushare
