#include "agent/client/route.h"

#include <fmt/format.h>

namespace gpusnap::agent {

namespace {

Route InProcess(std::string store, std::string note) {
  Route r;
  r.store = std::move(store);
  r.note = std::move(note);
  return r;
}

// "--a", "--a and --b", "--a, --b and --c".
std::string JoinFlags(const std::vector<std::string>& flags) {
  std::string out;
  for (size_t i = 0; i < flags.size(); ++i)
    out += (i == 0 ? "" : i + 1 == flags.size() ? " and " : ", ") + flags[i];
  return out;
}

// The store the user named and where it came from; empty if none.
std::pair<std::string, std::string> NamedStore(const RouteInputs& in) {
  if (!in.store_flag.empty()) return {in.store_flag, "--store"};
  if (!in.store_env.empty()) return {in.store_env, "$GPUSNAP_STORE"};
  return {};
}

}  // namespace

std::string AgentSocketFrom(const std::string& env_value) {
  return env_value.empty() ? kDefaultAgentSocket : env_value;
}

Result<Route> ChooseRoute(const RouteInputs& in, const AgentProbe& probe) {
  if (in.no_agent) {
    if (!in.agent_flag.empty())
      return Status::Error(Code::kInvalidArgument, "--agent and --no-agent exclude each other");
    return InProcess("", "");
  }
  const bool asked = !in.agent_flag.empty();
  const auto [named, named_by] = NamedStore(in);

  if (probe.state != ProbeState::kAnswered) {
    if (asked)
      return Status::Error(Code::kNotFound, "cannot reach the agent at `{}`: {}", in.socket, probe.detail);
    switch (probe.state) {
      case ProbeState::kDenied:
        return Status::Error(Code::kFailedPrecondition,
                             "the agent's socket `{}` is not accessible ({}): run as root to use the agent, or pass "
                             "--no-agent to work in-process",
                             in.socket, probe.detail);
      case ProbeState::kBusy:
        return Status::Error(Code::kTimeout,
                             "the agent on `{}` is busy ({}): try again, or pass --no-agent to work in-process",
                             in.socket, probe.detail);
      case ProbeState::kNoAnswer:
        return Status::Error(Code::kExternal,
                             "something listens on the agent's socket `{}` but gives no agent's answer ({}): pass "
                             "--no-agent to work in-process",
                             in.socket, probe.detail);
      case ProbeState::kStale:
        return InProcess("", fmt::format("no agent answers on `{}` ({}); working in-process", in.socket,
                                         probe.detail));
      default:
        return InProcess("", "");
    }
  }

  // An agent answered.
  if (!named.empty() && named != probe.store) {
    if (asked)
      return Status::Error(Code::kInvalidArgument, "{} `{}` is not the store of the agent at `{}` (`{}`)", named_by,
                           named, in.socket, probe.store.empty() ? "unknown" : probe.store);
    return InProcess("", fmt::format("the agent at `{}` uses the store `{}`, not `{}` ({}); working in-process",
                                     in.socket, probe.store.empty() ? "unknown" : probe.store, named, named_by));
  }
  if (!in.in_process_only.empty()) {
    std::string flags = JoinFlags(in.in_process_only);
    if (asked)
      return Status::Error(Code::kInvalidArgument,
                           "{} {} not apply with --agent: the agent uses its own settings", flags,
                           in.in_process_only.size() == 1 ? "does" : "do");
    return InProcess(probe.store, fmt::format("{} {} not apply through the agent; working in-process on its store `{}`",
                                              flags, in.in_process_only.size() == 1 ? "does" : "do", probe.store));
  }
  Route r;
  r.through_agent = true;
  r.socket = in.socket;
  return r;
}

}  // namespace gpusnap::agent
