// How many connections one listener of the agent holds: in all (served or
// waiting for a worker), and from one peer (served). Past either limit a new
// connection is refused at once, so that a flood, or one slow peer, cannot
// take every worker from the others.
//
// Thread-safe. A limit of 0 is no limit. Every Enter that admits is matched
// by one Leave.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <string>

namespace gpusnap::agent {

class ConnectionLimits {
 public:
  ConnectionLimits(size_t max_in_all, size_t max_per_peer) : max_in_all_(max_in_all), max_per_peer_(max_per_peer) {}

  size_t max_in_all() const { return max_in_all_; }
  size_t max_per_peer() const { return max_per_peer_; }

  // One more connection on the listener; false: it holds max_in_all already.
  bool EnterListener();
  void LeaveListener();

  enum class PeerVerdict {
    kAdmitted,
    kRefused,       // the peer holds max_per_peer: refused, and the first refusal since it last was under
    kRefusedAgain,  // refused again before the peer went under its limit (worth no new log line)
  };
  // One more served connection from `peer` (its address; "" is one peer too).
  PeerVerdict EnterPeer(const std::string& peer);
  void LeavePeer(const std::string& peer);

 private:
  struct Peer {
    size_t connections = 0;
    bool refusal_reported = false;
  };
  const size_t max_in_all_;
  const size_t max_per_peer_;
  std::mutex mutex_;
  size_t in_all_ = 0;
  std::map<std::string, Peer> peers_;
};

}  // namespace gpusnap::agent
