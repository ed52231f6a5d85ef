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
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "gpusnap/status.h"

namespace gpusnap::net {

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

// Pure: the inode of the socket a /proc/<pid>/fd link names ("socket:[4242]"),
// nullopt for anything else.
std::optional<uint64_t> SocketInode(std::string_view fd_link);
// The ports the sockets `socket_inodes` listen on, as the network namespace
// of process `pid` shows them (its /proc/<pid>/net/tcp and tcp6).
std::vector<uint16_t> ListeningPortsOf(pid_t pid, const std::set<uint64_t>& socket_inodes);

// Ends the TIME_WAIT connections on `ports` in this process's network
// namespace; where the kernel refuses (no CONFIG_INET_DIAG_DESTROY, no
// CAP_NET_ADMIN) waits, calling `waiting` once with why, until they expire or
// `limit` passes. kTimeout if some are left then, naming the port.
Status FreeTimeWaitPorts(const std::vector<uint16_t>& ports, std::chrono::milliseconds limit,
                         const std::function<void(const std::string&)>& waiting);

}  // namespace gpusnap::net
