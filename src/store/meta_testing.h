// For unit tests: the metadata of a snapshot of a bare pid, without files or
// GPU state, as valid as the store requires it to read it back.
#pragma once

#include <string>

#include "gpusnap/snapshot.h"

namespace gpusnap {

inline SnapshotMeta BarePidMeta(const std::string& id) {
  SnapshotMeta m;
  m.id = id;
  m.created = "2026-11-29T23:30:00.000Z";
  m.source.kind = "pid";
  m.source.host_pid = 4711;
  m.source.ns_pid = 1;
  m.criu_version = "4.3";
  return m;
}

}  // namespace gpusnap
