#include "gpushare/protocol.h"

#include <array>
#include <utility>

namespace gpusnap {
namespace {

constexpr std::array<std::pair<ShimCommand, const char*>, 5> kCommands{{
    {ShimCommand::kState, "state"},
    {ShimCommand::kQuiesce, "quiesce"},
    {ShimCommand::kRelease, "release"},
    {ShimCommand::kLoad, "load"},
    {ShimCommand::kResume, "resume"},
}};

bool NeedsPaths(ShimCommand c) { return c == ShimCommand::kRelease || c == ShimCommand::kLoad; }

}  // namespace

const char* ShimCommandName(ShimCommand command) {
  for (const auto& [c, name] : kCommands) {
    if (c == command) return name;
  }
  return "?";
}

std::string FormatControlRequest(const ControlRequest& request) {
  nlohmann::json j{{"cmd", ShimCommandName(request.command)}};
  if (NeedsPaths(request.command)) {
    j["chunk_store"] = request.chunk_store;
    j["manifest"] = request.manifest;
  }
  if (request.command == ShimCommand::kQuiesce) j["timeout_ms"] = request.timeout_ms;
  return j.dump() + "\n";
}

Result<ControlRequest> ParseControlRequest(std::string_view line) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::Error(Code::kInvalidArgument, "control request is not JSON");
  if (!j.is_object()) return Status::Error(Code::kInvalidArgument, "control request is not a JSON object");
  auto cmd = j.find("cmd");
  if (cmd == j.end() || !cmd->is_string())
    return Status::Error(Code::kInvalidArgument, "control request has no \"cmd\" string");
  ControlRequest req;
  bool known = false;
  for (const auto& [c, name] : kCommands) {
    if (*cmd == name) {
      req.command = c;
      known = true;
    }
  }
  if (!known)
    return Status::Error(Code::kInvalidArgument,
                         "unknown control command `{}` (known: state, quiesce, release, load, resume)",
                         cmd->get<std::string>());
  for (const auto& [key, value] : j.items()) {
    if (key == "cmd") continue;
    bool allowed = (NeedsPaths(req.command) && (key == "chunk_store" || key == "manifest")) ||
                   (req.command == ShimCommand::kQuiesce && key == "timeout_ms");
    if (!allowed) return Status::Error(Code::kInvalidArgument, "`{}` takes no field `{}`", cmd->get<std::string>(), key);
  }
  if (NeedsPaths(req.command)) {
    for (auto [key, out] : {std::pair{"chunk_store", &req.chunk_store}, std::pair{"manifest", &req.manifest}}) {
      auto it = j.find(key);
      if (it == j.end() || !it->is_string())
        return Status::Error(Code::kInvalidArgument, "`{}` needs a \"{}\" string", cmd->get<std::string>(), key);
      *out = it->get<std::string>();
      if (out->empty() || (*out)[0] != '/')
        return Status::Error(Code::kInvalidArgument, "\"{}\" must be an absolute path, not `{}`", key, *out);
    }
  }
  if (auto it = j.find("timeout_ms"); it != j.end()) {
    if (!it->is_number_integer() || *it < 1 || *it > 3600000)
      return Status::Error(Code::kInvalidArgument, "\"timeout_ms\" must be an integer of 1..3600000, not {}",
                           it->dump());
    req.timeout_ms = it->get<int>();
  }
  return req;
}

std::string FormatControlReply(nlohmann::json fields) {
  if (!fields.is_object()) fields = nlohmann::json::object();
  fields["ok"] = true;
  return fields.dump() + "\n";
}

std::string FormatControlError(std::string_view message) {
  return nlohmann::json{{"ok", false}, {"error", std::string(message)}}.dump() + "\n";
}

Result<nlohmann::json> ParseControlReply(std::string_view line) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("ok") || !j["ok"].is_boolean())
    return Status::Error(Code::kInternal, "malformed reply from the gpushare shim: `{}`",
                         std::string(line.substr(0, 200)));
  if (!j["ok"].get<bool>()) {
    std::string error = j.contains("error") && j["error"].is_string() ? j["error"].get<std::string>() : "no reason given";
    return Status::Error(Code::kExternal, "{}", error);
  }
  return j;
}

std::string ControlSocketName(uint64_t pid_namespace_inode, int pid_in_namespace) {
  return fmt::format("gpusnap-gpushare.{}.{}", pid_namespace_inode, pid_in_namespace);
}

bool ControlPeerAllowed(uint32_t peer_uid, uint32_t own_uid, bool peer_in_same_pid_namespace) {
  return peer_uid == 0 || (peer_uid == own_uid && peer_in_same_pid_namespace);
}

}  // namespace gpusnap
