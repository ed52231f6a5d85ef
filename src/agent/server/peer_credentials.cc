#include "agent/server/peer_credentials.h"

#include <sys/socket.h>

#include <fmt/format.h>

#include "agent/api/request.h"
#include "util/files.h"

namespace gpusnap::agent {

std::optional<PeerCredentials> PeerCredentialsOf(int sock) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof cred) return std::nullopt;
  return PeerCredentials{cred.pid, cred.uid, cred.gid};
}

bool UidMayCall(uid_t uid, const std::set<uid_t>& allowed_uids) { return uid == 0 || allowed_uids.contains(uid); }

std::string DescribePeer(const PeerCredentials& peer, const std::string& command) {
  std::string who = fmt::format("uid {} (gid {}, pid {}", peer.uid, peer.gid, peer.pid);
  if (!command.empty()) who += fmt::format(" `{}`", Printable(command));
  return who + ")";
}

std::string DescribePeer(const PeerCredentials& peer) {
  auto comm = ReadFile(fmt::format("/proc/{}/comm", peer.pid));
  std::string command = comm.ok() ? *comm : "";
  while (!command.empty() && command.back() == '\n') command.pop_back();
  return DescribePeer(peer, command);
}

}  // namespace gpusnap::agent
