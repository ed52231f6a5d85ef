// The TCP ports a restore must bind again, and what may hold them.
//
// A tree's listening socket comes back bound to its old port. Connections the
// tree accepted there and closed itself shortly before the checkpoint (NCCL's
// bootstrap, a store's short-lived clients) linger on that port in TIME_WAIT
// for 60 s, and a listener that did not set SO_REUSEADDR (NCCL's do not)
// cannot bind beside them: CRIU fails with EADDRINUSE. Those connections
// belong to the checkpointed tree, which is gone, so a restore in the same
// network namespace ends them first (SOCK_DESTROY), or waits them out where
// the kernel cannot.
#pragma once

#include <sys/types.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "gpusnap/status.h"
#include "snapshot/checkpointable.h"

namespace gpusnap {

// One row of /proc/net/tcp or tcp6.
struct TcpRow {
  bool v6 = false;
  std::array<uint8_t, 16> local{};  // network byte order; the first 4 bytes for IPv4
  uint16_t local_port = 0;
  std::array<uint8_t, 16> remote{};
  uint16_t remote_port = 0;
  int state = 0;  // the kernel's TCP_* number: 6 TIME_WAIT, 10 LISTEN
  uint64_t inode = 0;
};
inline constexpr int kTcpTimeWait = 6;
inline constexpr int kTcpListen = 10;

// Pure: the rows of the file's text (its header and malformed lines skipped).
std::vector<TcpRow> ParseProcNetTcp(std::string_view text, bool v6);
// Pure: the ports of the listening sockets among `rows` whose inode is one of
// `socket_inodes` (the tree's own), sorted, each once.
std::vector<uint16_t> ListeningPorts(const std::vector<TcpRow>& rows, const std::set<uint64_t>& socket_inodes);
// Pure: the TIME_WAIT connections on one of `ports` (as their local port).
std::vector<TcpRow> TimeWaitOn(const std::vector<TcpRow>& rows, const std::vector<uint16_t>& ports);

// The ports the tree listens on (its sockets, as the network namespace of its
// first process shows them).
std::vector<uint16_t> TreeListeningPorts(const std::vector<ProcessFiles>& tree);

// Ends the TIME_WAIT connections on `ports` in this process's network
// namespace; where the kernel refuses (no CONFIG_INET_DIAG_DESTROY, no
// CAP_NET_ADMIN) waits, calling `waiting` once with why, until they expire or
// `limit` passes. kTimeout if some are left then, naming the port.
Status FreeTimeWaitPorts(const std::vector<uint16_t>& ports, std::chrono::milliseconds limit,
                         const std::function<void(const std::string&)>& waiting);

}  // namespace gpusnap
