// Who is at the other end of the agent's unix socket: the kernel's word for
// it (SO_PEERCRED, taken when the caller connected), not anything the caller
// says. The socket file's mode keeps others out only while nobody widens it;
// the agent checks every connection itself, so a socket made reachable by
// mistake (a chmod, a bind mount into a pod) still serves no one but root and
// the uids the administrator names (`gpusnap agent --allow-uid`).
#pragma once

#include <sys/types.h>

#include <optional>
#include <set>
#include <string>

namespace gpusnap::agent {

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// The connecting process's credentials; nullopt when the kernel gives none
// (not a unix socket).
std::optional<PeerCredentials> PeerCredentialsOf(int sock);

// Pure. Root may call, and so may the uids the administrator allowed.
bool UidMayCall(uid_t uid, const std::set<uid_t>& allowed_uids);

// Pure. "uid 1000 (gid 1000, pid 4242 `curl`)": who asked, for the log.
// `command` may be empty (the process is gone, or /proc hides it).
std::string DescribePeer(const PeerCredentials& peer, const std::string& command);

// DescribePeer with the process's command read from /proc now.
std::string DescribePeer(const PeerCredentials& peer);

}  // namespace gpusnap::agent
