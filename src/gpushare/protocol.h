// The gpushare control protocol between gpusnap and the shim inside a
// workload process (docs/GPUSHARE.md).
//
// Transport: the abstract unix stream socket named by ControlSocketName; one
// request per connection, one JSON object per line each way:
//   {"cmd":"state"}
//   {"cmd":"quiesce","timeout_ms":10000}       hold new GPU work, drain what runs
//   {"cmd":"release","chunk_store":DIR,"manifest":FILE}
//                                              save device memory as chunks, free it
//   {"cmd":"load","chunk_store":DIR,"manifest":FILE}
//                                              re-create it at the same addresses
//   {"cmd":"resume"}                           let held work go
// Reply: {"ok":true, ...fields} or {"ok":false,"error":"..."}. Every reply
// carries "state" (running|quiesced|released) and the allocation totals.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "gpusnap/status.h"

namespace gpusnap {

enum class ShimCommand { kState, kQuiesce, kRelease, kLoad, kResume };

const char* ShimCommandName(ShimCommand command);

struct ControlRequest {
  ShimCommand command = ShimCommand::kState;
  std::string chunk_store;  // release, load: the chunk store's root directory
  std::string manifest;     // release: where to write the manifest; load: where to read it
  int timeout_ms = 10000;   // quiesce: how long in-flight work may take to drain

  bool operator==(const ControlRequest&) const = default;
};

// One line, newline-terminated.
std::string FormatControlRequest(const ControlRequest& request);
// kInvalidArgument naming what is wrong: not JSON, not an object, an unknown
// command (listing the known ones), a missing or mistyped field, an unknown
// field, a relative path, a timeout out of 1..3600000 ms.
Result<ControlRequest> ParseControlRequest(std::string_view line);

// The reply line for `fields` (an object): "ok" is set here.
std::string FormatControlReply(nlohmann::json fields);
std::string FormatControlError(std::string_view message);
// The reply's fields; a reply saying ok:false becomes kExternal with its
// error; a malformed one kInternal naming the bytes.
Result<nlohmann::json> ParseControlReply(std::string_view line);

// The socket's abstract name, without the leading NUL. The pid namespace's
// inode is part of it because every workload gpusnap runs has pid 2 in its
// own namespace while all of them share the network namespace, where abstract
// names live.
std::string ControlSocketName(uint64_t pid_namespace_inode, int pid_in_namespace);

// Who may talk to the control socket: root, or the process's own uid from
// inside the process's own pid namespace.
bool ControlPeerAllowed(uint32_t peer_uid, uint32_t own_uid, bool peer_in_same_pid_namespace);

}  // namespace gpusnap
