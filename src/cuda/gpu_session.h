// The driver loaded once (one cuInit) and a primary context per GPU, kept
// for as long as the session lives. A one-shot gpusnap makes a session for
// its one operation; the agent makes one when it starts and hands it to every
// job, so that no job pays for cuInit and a context again (docs/AGENT.md).
//
// A retained primary context holds device memory of its own on its GPU for
// the session's life: the price of a job's not making it.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>

#include "cuda/driver.h"
#include "gpusnap/status.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace gpusnap::cuda {

class GpuSession {
 public:
  // Loads the driver (Driver::Load: its errors).
  static Result<std::shared_ptr<GpuSession>> Open(const LoadOptions& options = {});
  // `kept` (a long-lived process's session) if set, else Open().
  static Result<std::shared_ptr<GpuSession>> KeptOrOpen(std::shared_ptr<GpuSession> kept);
  explicit GpuSession(std::shared_ptr<Driver> driver) : driver_(std::move(driver)) {}
  GpuSession(const GpuSession&) = delete;
  GpuSession& operator=(const GpuSession&) = delete;
  // Releases the contexts it retained.
  ~GpuSession() EXCLUDES(mu_);

  // Shared: a driver call that never returns keeps it alive.
  const std::shared_ptr<Driver>& driver() const { return driver_; }

  // The primary context of GPU `ordinal`, retained the first time it is
  // asked for and kept until the session goes. kNotSupported for a driver
  // without the primary context calls; kExternal naming the failed call, the
  // GPU and the CUresult.
  Result<abi::CUcontext> Context(int ordinal) EXCLUDES(mu_);
  // Retains the context of every GPU the driver reports; the count.
  Result<int> RetainAll() EXCLUDES(mu_);

  // Free bytes of GPU `ordinal` now, as cuMemGetInfo tells it in its primary
  // context (made current on the calling thread). Errors as Context's, and
  // kNotSupported for a driver without cuMemGetInfo_v2.
  Result<std::uint64_t> FreeBytes(int ordinal) EXCLUDES(mu_);

 private:
  std::shared_ptr<Driver> driver_;
  Mutex mu_;
  std::map<int, std::pair<abi::CUdevice, abi::CUcontext>> contexts_ GUARDED_BY(mu_);  // by ordinal
};

}  // namespace gpusnap::cuda
