// Which way a CLI command goes: as a job of the node agent, or in the CLI's
// own process (docs/AGENT.md, "From the CLI"). ChooseRoute is pure: the
// caller looks at the socket (ProbeAgent in agent/client/client.h), makes the store
// paths canonical, and prints what comes back.
//
// The rules, in order:
//  1. `--no-agent`: in-process. With `--agent` too: refused.
//  2. `--agent SOCKET`: through that agent, or refused (kNotFound when it does
//     not answer; kInvalidArgument for flags only the in-process path honours,
//     and for a --store or $GPUSNAP_STORE that is not the agent's store).
//  3. Otherwise the socket ($GPUSNAP_AGENT_SOCKET, else kDefaultAgentSocket).
//     In-process only where no agent exists: where no process can be
//     listening on the path. Anything else may be an agent, and a command
//     that went around it would skip its one-job-per-container rule.
//     - absent: in-process, without a word;
//     - stale (a file that is no socket, or a socket nothing listens on:
//       connect() says ECONNREFUSED, as for a killed agent's): in-process,
//       with a note;
//     - not accessible (permission denied): refused (kFailedPrecondition),
//       pointing at --no-agent;
//     - busy (the connection not taken, or no answer, within the probe's
//       wait: a full backlog, every worker taken): refused (kTimeout);
//     - something that answers, but not as an agent: refused (kExternal);
//     - an agent answered: through it, unless --store or $GPUSNAP_STORE names
//       another store (then in-process on that store, with a note: a named
//       store is never swapped for another) or a flag only the in-process
//       path honours is given (then in-process on the agent's store, with a
//       note).
#pragma once

#include <string>
#include <vector>

#include "gpusnap/status.h"

namespace gpusnap::agent {

inline constexpr char kDefaultAgentSocket[] = "/run/gpusnap-agent/agent.sock";
inline constexpr char kAgentSocketEnv[] = "GPUSNAP_AGENT_SOCKET";

// `env_value` ($GPUSNAP_AGENT_SOCKET) if not empty, else kDefaultAgentSocket.
std::string AgentSocketFrom(const std::string& env_value);

// What a look at the agent's socket found.
enum class ProbeState {
  kNotProbed,  // nobody looked (--no-agent)
  kAbsent,     // no file at the path
  kDenied,     // the path or the socket refused us (EACCES, EPERM)
  kStale,      // a file, but not a socket, or nothing listens on it: no agent exists
  kBusy,       // something listens, but took or answered no connection within the wait
  kNoAnswer,   // connected, but what answered GET /healthz is no agent's answer
  kAnswered,   // an agent answered GET /healthz
};

struct AgentProbe {
  ProbeState state = ProbeState::kNotProbed;
  std::string detail;  // why, in words, for a note or an error
  std::string store;   // kAnswered: the agent's store, canonical; empty if it did not say
};

struct RouteInputs {
  std::string agent_flag;   // --agent SOCKET; empty: not given
  bool no_agent = false;    // --no-agent
  std::string socket;       // the socket probed: agent_flag, else AgentSocketFrom($GPUSNAP_AGENT_SOCKET)
  std::string store_flag;   // --store, canonical; empty: not given
  std::string store_env;    // $GPUSNAP_STORE, canonical; empty: not set
  // Flags the user gave that only the in-process path honours ("--verbose").
  std::vector<std::string> in_process_only;
};

struct Route {
  bool through_agent = false;
  std::string socket;  // through_agent: the agent's socket
  // In-process: the store to use; empty: the usual one (--store, else
  // $GPUSNAP_STORE, else /var/lib/gpusnap).
  std::string store;
  std::string note;    // one line for stderr, or empty
};

Result<Route> ChooseRoute(const RouteInputs& in, const AgentProbe& probe);

}  // namespace gpusnap::agent
