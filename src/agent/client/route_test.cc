#include "agent/client/route.h"

#include <gtest/gtest.h>

namespace gpusnap::agent {
namespace {

const char kSocket[] = "/run/gpusnap-agent/agent.sock";
const char kAgentStore[] = "/var/lib/gpusnap";

RouteInputs Auto() {
  RouteInputs in;
  in.socket = kSocket;
  return in;
}

RouteInputs Asked() {
  RouteInputs in = Auto();
  in.agent_flag = kSocket;
  return in;
}

AgentProbe Probe(ProbeState state, std::string detail = "") { return {state, std::move(detail), ""}; }
AgentProbe Answered(std::string store = kAgentStore) { return {ProbeState::kAnswered, "", std::move(store)}; }

Route Ok(const RouteInputs& in, const AgentProbe& probe) {
  auto r = ChooseRoute(in, probe);
  if (!r.ok()) ADD_FAILURE() << "refused: " << r.status().message();
  return r.ok() ? *r : Route{};
}

Status Refused(const RouteInputs& in, const AgentProbe& probe) {
  auto r = ChooseRoute(in, probe);
  EXPECT_FALSE(r.ok()) << "chose " << (r.ok() && r->through_agent ? "the agent" : "in-process");
  return r.ok() ? Status::Ok() : r.status();
}

TEST(AgentRoute, SocketFromTheEnvironmentOrTheDefault) {
  EXPECT_EQ(AgentSocketFrom(""), kDefaultAgentSocket);
  EXPECT_EQ(AgentSocketFrom("/tmp/a.sock"), "/tmp/a.sock");
}

TEST(AgentRoute, AnAnsweringAgentTakesTheCommand) {
  Route r = Ok(Auto(), Answered());
  EXPECT_TRUE(r.through_agent);
  EXPECT_EQ(r.socket, kSocket);
  EXPECT_EQ(r.note, "");
}

TEST(AgentRoute, NoSocketIsInProcessWithoutANote) {
  Route r = Ok(Auto(), Probe(ProbeState::kAbsent));
  EXPECT_FALSE(r.through_agent);
  EXPECT_EQ(r.store, "");
  EXPECT_EQ(r.note, "");
}

TEST(AgentRoute, StaleSocketIsInProcessWithOneNote) {
  Route r = Ok(Auto(), Probe(ProbeState::kStale, "Connection refused"));
  EXPECT_FALSE(r.through_agent);
  EXPECT_EQ(r.note, "no agent answers on `/run/gpusnap-agent/agent.sock` (Connection refused); working in-process");
}

TEST(AgentRoute, ABusyAgentIsNoMissingAgent) {
  // Working around a busy agent would skip its one job per container.
  Status st = Refused(Auto(), Probe(ProbeState::kBusy, "no answer to GET /healthz within 10 s"));
  EXPECT_EQ(st.code(), Code::kTimeout);
  EXPECT_EQ(st.message(), "the agent on `/run/gpusnap-agent/agent.sock` is busy (no answer to GET /healthz within "
                          "10 s): try again, or pass --no-agent to work in-process");
  st = Refused(Auto(), Probe(ProbeState::kNoAnswer, "GET /healthz answered HTTP 404"));
  EXPECT_EQ(st.code(), Code::kExternal);
  EXPECT_NE(st.message().find("HTTP 404"), std::string::npos);
  EXPECT_NE(st.message().find("--no-agent"), std::string::npos);
  // Named with --no-agent, nobody looked: in-process.
  RouteInputs in = Auto();
  in.no_agent = true;
  EXPECT_FALSE(Ok(in, Probe(ProbeState::kNotProbed)).through_agent);
}

TEST(AgentRoute, NoAgentFlagIsInProcessWhateverTheSocket) {
  RouteInputs in = Auto();
  in.no_agent = true;
  Route r = Ok(in, Probe(ProbeState::kNotProbed));
  EXPECT_FALSE(r.through_agent);
  EXPECT_EQ(r.note, "");
  in.agent_flag = kSocket;
  EXPECT_EQ(Refused(in, Answered()).code(), Code::kInvalidArgument);
}

TEST(AgentRoute, PermissionDeniedIsRefusedPointingAtNoAgent) {
  Status st = Refused(Auto(), Probe(ProbeState::kDenied, "Permission denied"));
  EXPECT_EQ(st.code(), Code::kFailedPrecondition);
  EXPECT_NE(st.message().find("Permission denied"), std::string::npos);
  EXPECT_NE(st.message().find("--no-agent"), std::string::npos);
}

TEST(AgentRoute, TheAgentsOwnStoreNamedIsFine) {
  RouteInputs in = Auto();
  in.store_flag = kAgentStore;
  EXPECT_TRUE(Ok(in, Answered()).through_agent);
  in = Auto();
  in.store_env = kAgentStore;
  EXPECT_TRUE(Ok(in, Answered()).through_agent);
}

TEST(AgentRoute, AnotherStoreNamedIsInProcessOnThatStore) {
  RouteInputs in = Auto();
  in.store_flag = "/srv/snaps";
  Route r = Ok(in, Answered());
  EXPECT_FALSE(r.through_agent);
  EXPECT_EQ(r.store, "");  // the usual resolution: the --store given
  EXPECT_EQ(r.note,
            "the agent at `/run/gpusnap-agent/agent.sock` uses the store `/var/lib/gpusnap`, not `/srv/snaps` "
            "(--store); working in-process");
  in = Auto();
  in.store_env = "/srv/snaps";
  r = Ok(in, Answered());
  EXPECT_FALSE(r.through_agent);
  EXPECT_NE(r.note.find("($GPUSNAP_STORE)"), std::string::npos);
}

TEST(AgentRoute, TheFlagWinsOverTheEnvironment) {
  RouteInputs in = Auto();
  in.store_flag = kAgentStore;
  in.store_env = "/srv/snaps";
  EXPECT_TRUE(Ok(in, Answered()).through_agent);
  in.store_flag = "/srv/snaps";
  in.store_env = kAgentStore;
  EXPECT_FALSE(Ok(in, Answered()).through_agent);
}

TEST(AgentRoute, AnAgentThatDoesNotSayItsStoreKeepsANamedStoreInProcess) {
  RouteInputs in = Auto();
  in.store_flag = kAgentStore;
  Route r = Ok(in, Answered(""));
  EXPECT_FALSE(r.through_agent);
  EXPECT_NE(r.note.find("`unknown`"), std::string::npos);
  EXPECT_TRUE(Ok(Auto(), Answered("")).through_agent);
}

TEST(AgentRoute, InProcessOnlyFlagsRunInProcessOnTheAgentsStore) {
  RouteInputs in = Auto();
  in.in_process_only = {"--verbose", "--criu"};
  Route r = Ok(in, Answered());
  EXPECT_FALSE(r.through_agent);
  EXPECT_EQ(r.store, kAgentStore);
  EXPECT_EQ(r.note, "--verbose and --criu do not apply through the agent; working in-process on its store "
                    "`/var/lib/gpusnap`");
  // Without an agent they need no word.
  EXPECT_EQ(Ok(in, Probe(ProbeState::kAbsent)).note, "");
}

TEST(AgentRoute, AskedForAnAgentThatDoesNotAnswer) {
  for (ProbeState s : {ProbeState::kAbsent, ProbeState::kStale, ProbeState::kBusy, ProbeState::kNoAnswer,
                       ProbeState::kDenied}) {
    Status st = Refused(Asked(), Probe(s, "why"));
    EXPECT_EQ(st.code(), Code::kNotFound);
    EXPECT_EQ(st.message(), "cannot reach the agent at `/run/gpusnap-agent/agent.sock`: why");
  }
}

TEST(AgentRoute, AskedForAnAgentRefusesWhatItCannotHonour) {
  RouteInputs in = Asked();
  in.in_process_only = {"--tcp-established", "--criu", "--verbose"};
  Status st = Refused(in, Answered());
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "--tcp-established, --criu and --verbose do not apply with --agent: the agent uses its own settings");
  in = Asked();
  in.store_env = "/srv/snaps";
  st = Refused(in, Answered());
  EXPECT_EQ(st.message(), "$GPUSNAP_STORE `/srv/snaps` is not the store of the agent at "
                          "`/run/gpusnap-agent/agent.sock` (`/var/lib/gpusnap`)");
  in.store_env = kAgentStore;
  EXPECT_TRUE(Ok(in, Answered()).through_agent);
}

}  // namespace
}  // namespace gpusnap::agent
