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
//   {"cmd":"export","object":N}                a new POSIX fd of the device memory object N
//                                              (an allocation's address, or a VMM handle the
//                                              application holds), passed with the reply
//   {"cmd":"remap","import":N}                 with an fd passed alongside: map it again where
//                                              the imported object N was mapped before release
//   {"cmd":"adopt","object":VA}                with an fd passed alongside (memory gpusnap made
//                                              and filled during the restore): the released
//                                              allocation at VA takes it instead of new memory
// Reply: {"ok":true, ...fields} or {"ok":false,"error":"..."}. Every reply
// carries "state" (running|quiesced|released), the allocation totals and
// "shim_allocations" [{va, size}] (the shim's allocations mapped now, which
// gpusnap may hold through a release); the
// state reply also lists "exports" [{object, fd}] and "imports" [{import, fd}]:
// the descriptors each process keeps of memory it shared, by which gpusnap
// tells whose memory an import is (kcmp).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

#include "gpusnap/status.h"

namespace gpusnap::gpushare {

enum class ShimCommand { kState, kQuiesce, kRelease, kLoad, kResume, kExport, kRemap, kAdopt };

const char* ShimCommandName(ShimCommand command);

struct ControlRequest {
  ShimCommand command = ShimCommand::kState;
  std::string chunk_store;  // release, load: the chunk store's root directory
  std::string manifest;     // release: where to write the manifest; load: where to read it
  int timeout_ms = 10000;   // quiesce: how long in-flight work may take to drain
  uint64_t object = 0;      // export: the object; remap: the import; adopt: the allocation

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
// `timed_out`: the step ran out of time (a retry may succeed); the reply says
// "timeout": true.
std::string FormatControlError(std::string_view message, bool timed_out = false);
// The reply's fields; a reply saying ok:false becomes kExternal with its
// error (kTimeout when it says it timed out); a malformed one kInternal
// naming the bytes.
Result<nlohmann::json> ParseControlReply(std::string_view line);

// The socket's abstract name, without the leading NUL. The pid namespace's
// inode is part of it because every workload gpusnap runs has pid 2 in its
// own namespace while all of them share the network namespace, where abstract
// names live. Namespace inodes are reused once a namespace is gone, while a
// restored process keeps the name it had (CRIU restores it as it was): a
// process that finds its name taken takes the next generation (".<n>").
std::string ControlSocketName(uint64_t pid_namespace_inode, int pid_in_namespace, uint32_t generation = 0);
inline constexpr uint32_t kControlSocketGenerations = 64;

// A CUDA IPC handle (64 opaque bytes) for gpushare memory: which process
// exported it (its control socket) and which object, at which offset. The
// importer's shim connects to the exporter and asks for an fd.
struct IpcHandle {
  uint64_t pid_namespace_inode = 0;  // the exporter's control socket name (ControlSocketName)
  int32_t pid = 0;
  uint64_t object = 0;
  uint64_t offset = 0;  // of the pointer the handle was made for, inside the object
  uint64_t size = 0;    // the object's
  uint32_t generation = 0;  // of the control socket's name (zero in handles of older shims)

  bool operator==(const IpcHandle&) const = default;
};
inline constexpr size_t kIpcHandleBytes = 64;
void EncodeIpcHandle(const IpcHandle& handle, unsigned char out[kIpcHandleBytes]);
// nullopt for a handle the driver made (no gpushare magic).
std::optional<IpcHandle> DecodeIpcHandle(const unsigned char in[kIpcHandleBytes]);

// Who may talk to the control socket: root, or the process's own uid from
// inside the process's own pid namespace.
bool ControlPeerAllowed(uint32_t peer_uid, uint32_t own_uid, bool peer_in_same_pid_namespace);

}  // namespace gpusnap::gpushare
