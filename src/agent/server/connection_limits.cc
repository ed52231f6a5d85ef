#include "agent/server/connection_limits.h"

namespace gpusnap::agent {

bool ConnectionLimits::EnterListener() {
  std::lock_guard lock(mutex_);
  if (max_in_all_ != 0 && in_all_ >= max_in_all_) return false;
  ++in_all_;
  return true;
}

void ConnectionLimits::LeaveListener() {
  std::lock_guard lock(mutex_);
  if (in_all_ > 0) --in_all_;
}

ConnectionLimits::PeerVerdict ConnectionLimits::EnterPeer(const std::string& peer) {
  std::lock_guard lock(mutex_);
  Peer& p = peers_[peer];
  if (max_per_peer_ != 0 && p.connections >= max_per_peer_) {
    if (p.refusal_reported) return PeerVerdict::kRefusedAgain;
    p.refusal_reported = true;
    return PeerVerdict::kRefused;
  }
  ++p.connections;
  return PeerVerdict::kAdmitted;
}

void ConnectionLimits::LeavePeer(const std::string& peer) {
  std::lock_guard lock(mutex_);
  auto it = peers_.find(peer);
  if (it == peers_.end()) return;
  if (it->second.connections > 0) --it->second.connections;
  it->second.refusal_reported = false;  // under its limit again
  if (it->second.connections == 0) peers_.erase(it);
}

}  // namespace gpusnap::agent
