#include "net/tcp_ports.h"

#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <sstream>
#include <thread>

#include "util/fd.h"
#include "util/files.h"

namespace gpusnap::net {
namespace {

bool ParseHex(std::string_view s, uint64_t& out) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out, 16);
  return ec == std::errc() && end == s.data() + s.size();
}

// "0100007F:7451": the address as the kernel prints it (32-bit words in host
// order, here little-endian) and the port.
bool ParseEndpoint(std::string_view s, bool v6, std::array<uint8_t, 16>& addr, uint16_t& port) {
  size_t colon = s.find(':');
  size_t hex_len = v6 ? 32 : 8;
  if (colon != hex_len) return false;
  for (size_t w = 0; w < hex_len / 8; ++w) {
    uint64_t word = 0;
    if (!ParseHex(s.substr(w * 8, 8), word)) return false;
    for (int b = 0; b < 4; ++b) addr[w * 4 + b] = static_cast<uint8_t>(word >> (8 * b));
  }
  uint64_t p = 0;
  if (!ParseHex(s.substr(colon + 1), p) || p > 0xffff) return false;
  port = static_cast<uint16_t>(p);
  return true;
}

std::vector<TcpRow> ReadTable(const std::string& net_dir) {
  std::vector<TcpRow> rows;
  for (bool v6 : {false, true}) {
    auto text = ReadFile(net_dir + (v6 ? "/tcp6" : "/tcp"));
    if (!text.ok()) continue;  // no IPv6 in this kernel
    auto part = ParseProcNetTcp(*text, v6);
    rows.insert(rows.end(), part.begin(), part.end());
  }
  return rows;
}

// 0: ended or already gone; else the errno the kernel answered.
int DestroySocket(int netlink, const TcpRow& row) {
  struct {
    nlmsghdr header;
    inet_diag_req_v2 request;
  } msg{};
  msg.header.nlmsg_len = sizeof(msg);
  msg.header.nlmsg_type = SOCK_DESTROY;
  msg.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
  msg.request.sdiag_family = row.v6 ? AF_INET6 : AF_INET;
  msg.request.sdiag_protocol = IPPROTO_TCP;
  msg.request.idiag_states = ~0u;
  msg.request.id.idiag_sport = htons(row.local_port);
  msg.request.id.idiag_dport = htons(row.remote_port);
  std::memcpy(msg.request.id.idiag_src, row.local.data(), row.v6 ? 16 : 4);
  std::memcpy(msg.request.id.idiag_dst, row.remote.data(), row.v6 ? 16 : 4);
  msg.request.id.idiag_cookie[0] = msg.request.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(netlink, &msg, sizeof(msg), 0, reinterpret_cast<sockaddr*>(&kernel), sizeof(kernel)) < 0) return errno;
  alignas(nlmsghdr) char reply[512];
  ssize_t n = ::recv(netlink, reply, sizeof(reply), 0);
  if (n < static_cast<ssize_t>(sizeof(nlmsghdr) + sizeof(nlmsgerr))) return n < 0 ? errno : EPROTO;
  auto* header = reinterpret_cast<nlmsghdr*>(reply);
  if (header->nlmsg_type != NLMSG_ERROR) return EPROTO;
  int error = -reinterpret_cast<nlmsgerr*>(NLMSG_DATA(header))->error;
  return error == ENOENT ? 0 : error;
}

}  // namespace

std::vector<TcpRow> ParseProcNetTcp(std::string_view text, bool v6) {
  std::vector<TcpRow> rows;
  std::istringstream in{std::string(text)};
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
    std::istringstream fields(line);
    std::string sl, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
    if (!(fields >> sl >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode))
      continue;
    TcpRow row;
    row.v6 = v6;
    uint64_t st = 0, ino = 0;
    if (!ParseEndpoint(local, v6, row.local, row.local_port) || !ParseEndpoint(remote, v6, row.remote, row.remote_port) ||
        !ParseHex(state, st) || std::from_chars(inode.data(), inode.data() + inode.size(), ino).ec != std::errc())
      continue;
    row.state = static_cast<int>(st);
    row.inode = ino;
    rows.push_back(row);
  }
  return rows;
}

std::vector<uint16_t> ListeningPorts(const std::vector<TcpRow>& rows, const std::set<uint64_t>& socket_inodes) {
  std::set<uint16_t> ports;
  for (const TcpRow& r : rows)
    if (r.state == kTcpListen && socket_inodes.count(r.inode)) ports.insert(r.local_port);
  return {ports.begin(), ports.end()};
}

std::vector<TcpRow> TimeWaitOn(const std::vector<TcpRow>& rows, const std::vector<uint16_t>& ports) {
  std::vector<TcpRow> out;
  for (const TcpRow& r : rows)
    if (r.state == kTcpTimeWait && std::find(ports.begin(), ports.end(), r.local_port) != ports.end())
      out.push_back(r);
  return out;
}

std::optional<uint64_t> SocketInode(std::string_view fd_link) {
  uint64_t inode = 0;
  if (fd_link.starts_with("socket:[") && fd_link.ends_with("]") &&
      std::from_chars(fd_link.data() + 8, fd_link.data() + fd_link.size() - 1, inode).ec == std::errc())
    return inode;
  return std::nullopt;
}

std::vector<uint16_t> ListeningPortsOf(pid_t pid, const std::set<uint64_t>& socket_inodes) {
  return ListeningPorts(ReadTable("/proc/" + std::to_string(pid) + "/net"), socket_inodes);
}

Status FreeTimeWaitPorts(const std::vector<uint16_t>& ports, std::chrono::milliseconds limit,
                         const std::function<void(const std::string&)>& waiting) {
  if (ports.empty()) return Status::Ok();
  std::vector<TcpRow> lingering = TimeWaitOn(ReadTable("/proc/self/net"), ports);
  if (lingering.empty()) return Status::Ok();
  int refused = 0;
  UniqueFd netlink(::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
  if (!netlink.valid()) refused = errno;
  for (const TcpRow& row : lingering) {
    if (refused != 0) break;
    refused = DestroySocket(netlink.get(), row);
  }
  auto deadline = std::chrono::steady_clock::now() + limit;
  bool told = false;
  for (;;) {
    lingering = TimeWaitOn(ReadTable("/proc/self/net"), ports);
    if (lingering.empty()) return Status::Ok();
    if (std::chrono::steady_clock::now() >= deadline)
      return Status::Error(Code::kTimeout,
                           "port {} is still held by {} connection(s) in TIME_WAIT, which the restored listening "
                           "socket cannot bind beside; try again in a minute",
                           lingering.front().local_port, lingering.size());
    if (!told && waiting) {
      waiting(fmt::format("waiting for {} connection(s) in TIME_WAIT on port {} to expire (up to 60 s): the kernel "
                          "did not end them ({})",
                          lingering.size(), lingering.front().local_port,
                          refused != 0 ? std::strerror(refused) : "they came back"));
      told = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace gpusnap::net
