#include "gpushare/common/protocol.h"

#include <array>
#include <cstring>
#include <utility>

namespace gpusnap::gpushare {
namespace {

constexpr std::array<std::pair<ShimCommand, const char*>, 8> kCommands{{
    {ShimCommand::kState, "state"},
    {ShimCommand::kQuiesce, "quiesce"},
    {ShimCommand::kRelease, "release"},
    {ShimCommand::kLoad, "load"},
    {ShimCommand::kResume, "resume"},
    {ShimCommand::kExport, "export"},
    {ShimCommand::kRemap, "remap"},
    {ShimCommand::kAdopt, "adopt"},
}};

// The field naming an object, for the commands that take one.
const char* ObjectField(ShimCommand c) {
  switch (c) {
    case ShimCommand::kExport:
    case ShimCommand::kAdopt: return "object";
    case ShimCommand::kRemap: return "import";
    default: return nullptr;
  }
}

constexpr char kIpcMagic[12] = {'g', 'p', 'u', 's', 'n', 'a', 'p', '-', 'i', 'p', 'c', '1'};

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
  if (const char* field = ObjectField(request.command)) j[field] = request.object;
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
                         "unknown control command `{}` (known: state, quiesce, release, load, resume, export, remap, "
                         "adopt)",
                         cmd->get<std::string>());
  for (const auto& [key, value] : j.items()) {
    if (key == "cmd") continue;
    bool allowed = (NeedsPaths(req.command) && (key == "chunk_store" || key == "manifest")) ||
                   (req.command == ShimCommand::kQuiesce && key == "timeout_ms") ||
                   (ObjectField(req.command) != nullptr && key == ObjectField(req.command));
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
  if (const char* field = ObjectField(req.command)) {
    auto it = j.find(field);
    if (it == j.end() || !it->is_number_unsigned() || *it == 0)
      return Status::Error(Code::kInvalidArgument, "`{}` needs \"{}\": a positive integer", cmd->get<std::string>(),
                           field);
    req.object = it->get<uint64_t>();
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

std::string FormatControlError(std::string_view message, bool timed_out) {
  nlohmann::json j{{"ok", false}, {"error", std::string(message)}};
  if (timed_out) j["timeout"] = true;
  return j.dump() + "\n";
}

Result<nlohmann::json> ParseControlReply(std::string_view line) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("ok") || !j["ok"].is_boolean())
    return Status::Error(Code::kInternal, "malformed reply from the gpushare shim: `{}`",
                         std::string(line.substr(0, 200)));
  if (!j["ok"].get<bool>()) {
    std::string error = j.contains("error") && j["error"].is_string() ? j["error"].get<std::string>() : "no reason given";
    return Status::Error(j.value("timeout", false) == true ? Code::kTimeout : Code::kExternal, "{}", error);
  }
  return j;
}

std::string ControlSocketName(uint64_t pid_namespace_inode, int pid_in_namespace, uint32_t generation) {
  if (generation == 0) return fmt::format("gpusnap-gpushare.{}.{}", pid_namespace_inode, pid_in_namespace);
  return fmt::format("gpusnap-gpushare.{}.{}.{}", pid_namespace_inode, pid_in_namespace, generation);
}

void EncodeIpcHandle(const IpcHandle& h, unsigned char out[kIpcHandleBytes]) {
  std::memset(out, 0, kIpcHandleBytes);
  std::memcpy(out, kIpcMagic, sizeof kIpcMagic);
  unsigned char* p = out + sizeof kIpcMagic;
  for (auto [value, bytes] : {std::pair<const void*, size_t>{&h.pid_namespace_inode, 8}, {&h.pid, 4},
                              {&h.object, 8}, {&h.offset, 8}, {&h.size, 8}, {&h.generation, 4}}) {
    std::memcpy(p, value, bytes);
    p += bytes;
  }
}

std::optional<IpcHandle> DecodeIpcHandle(const unsigned char in[kIpcHandleBytes]) {
  if (std::memcmp(in, kIpcMagic, sizeof kIpcMagic) != 0) return std::nullopt;
  IpcHandle h;
  const unsigned char* p = in + sizeof kIpcMagic;
  for (auto [value, bytes] : {std::pair<void*, size_t>{&h.pid_namespace_inode, 8}, {&h.pid, 4}, {&h.object, 8},
                              {&h.offset, 8}, {&h.size, 8}, {&h.generation, 4}}) {
    std::memcpy(value, p, bytes);
    p += bytes;
  }
  return h;
}

bool ControlPeerAllowed(uint32_t peer_uid, uint32_t own_uid, bool peer_in_same_pid_namespace) {
  return peer_uid == 0 || (peer_uid == own_uid && peer_in_same_pid_namespace);
}

}  // namespace gpusnap::gpushare
