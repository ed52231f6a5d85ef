#include "gpushare/common/chunk_copy.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>

#include "util/first_failure.h"

namespace gpusnap::gpushare {
namespace {

// Loads stage pieces of chunks: small pinned buffers are quick to pin, and a
// piece's copy runs while the next piece is read.
constexpr uint64_t kStagingPieceBytes = 16ull << 20;

}  // namespace

std::vector<ChunkJob> ChunkJobs(const std::vector<DeviceRange>& ranges) {
  std::vector<ChunkJob> jobs;
  for (size_t r = 0; r < ranges.size(); ++r) {
    size_t i = 0;
    for (uint64_t off = 0; off < ranges[r].size; off += chunks::kChunkBytes, ++i)
      jobs.push_back({r, i, off, std::min(chunks::kChunkBytes, ranges[r].size - off)});
  }
  return jobs;
}

Staging::~Staging() {
  for (auto& [ctx, streams] : streams_) {
    d_.ctx_set_current(reinterpret_cast<abi::CUcontext>(ctx));
    for (abi::CUstream s : streams) d_.stream_destroy(s);
  }
  for (void* b : buffers_)
    if (b != nullptr) d_.free_host(b);
}

Result<void*> Staging::buffer(size_t i) {
  if (buffers_[i] == nullptr)  // portable: allocated in whichever context is current, usable from all
    GPUSNAP_RETURN_IF_CU_ERROR(d_, d_.host_alloc(&buffers_[i], buffer_bytes_, abi::kMemHostAllocPortable),
                               "cuMemHostAlloc");
  return buffers_[i];
}

Result<abi::CUstream> Staging::Stream(uint64_t ctx, size_t i) {
  GPUSNAP_RETURN_IF_CU_ERROR(d_, d_.ctx_set_current(reinterpret_cast<abi::CUcontext>(ctx)), "cuCtxSetCurrent");
  auto& streams = streams_[ctx];
  while (streams.size() <= i) {
    abi::CUstream s = nullptr;
    GPUSNAP_RETURN_IF_CU_ERROR(d_, d_.stream_create(&s, abi::kStreamNonBlocking), "cuStreamCreate");
    streams.push_back(s);
  }
  return streams[i];
}

Status RunChunkJobs(const RealDriver& d, size_t jobs, unsigned threads, int buffers, uint64_t buffer_bytes,
                    uint64_t context, const std::function<Status(Staging&, size_t job)>& work) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  FirstFailure failure;
  auto fail = [&](const Status& st) {
    failure.Record(st);
    failed = true;
  };
  auto run = [&] {
    // Pinned host memory is allocated in a context, though usable from all.
    if (abi::CUresult rc = d.ctx_set_current(reinterpret_cast<abi::CUcontext>(context)); rc != abi::CUDA_SUCCESS)
      return fail(d.Error("cuCtxSetCurrent", rc));
    Staging staging(d, buffers, buffer_bytes);
    for (size_t j; !failed && (j = next.fetch_add(1)) < jobs;) {
      if (Status st = work(staging, j); !st.ok()) return fail(st);
    }
    if (Status st = work(staging, SIZE_MAX); !st.ok()) fail(st);
  };
  threads = static_cast<unsigned>(std::clamp<size_t>(jobs, 1, threads));
  std::vector<std::thread> pool;
  for (unsigned i = 0; i < threads; ++i) pool.emplace_back(run);
  for (auto& t : pool) t.join();
  return failure.Get();
}

Status FillFromChunks(const RealDriver& d, const chunks::ChunkStore& store, const std::vector<DeviceRange>& ranges,
                      const std::vector<const chunks::ChunkedAllocation*>& sources, unsigned threads,
                      const PinnedLookup& pinned) {
  std::vector<ChunkJob> jobs = ChunkJobs(ranges);
  if (jobs.empty()) return Status::Ok();
  constexpr int kBuffers = 2;
  return RunChunkJobs(
      d, jobs.size(), threads, kBuffers, kStagingPieceBytes, ranges.front().context,
      [&](Staging& staging, size_t j) -> Status {
        auto& pending = staging.pending;
        pending.resize(kBuffers, nullptr);
        if (j == SIZE_MAX) {
          for (abi::CUstream& s : pending) {
            if (s) GPUSNAP_RETURN_IF_CU_ERROR(d, d.stream_synchronize(s), "cuStreamSynchronize");
            s = nullptr;
          }
          return Status::Ok();
        }
        const ChunkJob& job = jobs[j];
        const DeviceRange& r = ranges[job.range];
        const chunks::ChunkRef& ref = sources[job.range]->chunks[job.index];
        if (ref.length != job.length)
          return Status::Error(Code::kCorruption, "chunk {} of {:#x} has {} bytes, expected {}", job.index,
                               sources[job.range]->va, ref.length, job.length);
        // A memset or a copy from pinned memory needs no staging buffer: it
        // goes on stream 0. The drain waits on pending streams only: one of
        // another context must not be forgotten for this one.
        auto unstaged = [&](const std::function<abi::CUresult(abi::CUstream)>& enqueue, const char* name) -> Status {
          GPUSNAP_ASSIGN_OR_RETURN(abi::CUstream stream, staging.Stream(r.context, 0));
          GPUSNAP_RETURN_IF_CU_ERROR(d, enqueue(stream), name);
          if (pending[0] && pending[0] != stream) GPUSNAP_RETURN_IF_CU_ERROR(d, d.stream_synchronize(pending[0]), "cuStreamSynchronize");
          pending[0] = stream;
          return Status::Ok();
        };
        if (ref.zero)
          return unstaged([&](abi::CUstream s) { return d.memset_d8_async(r.va + job.offset, 0, job.length, s); },
                          "cuMemsetD8Async");
        if (const void* from = pinned ? pinned(ref) : nullptr)
          return unstaged([&](abi::CUstream s) { return d.copy_htod_async(r.va + job.offset, from, job.length, s); },
                          "cuMemcpyHtoDAsync");
        GPUSNAP_ASSIGN_OR_RETURN(chunks::ChunkReader reader, chunks::ChunkReader::Open(store, ref));
        for (uint64_t off = 0; reader.remaining() > 0;) {
          size_t slot = staging.turn++ % kBuffers;
          GPUSNAP_ASSIGN_OR_RETURN(abi::CUstream stream, staging.Stream(r.context, slot));
          // The buffer's previous copy must be done before it is refilled.
          if (pending[slot]) GPUSNAP_RETURN_IF_CU_ERROR(d, d.stream_synchronize(pending[slot]), "cuStreamSynchronize");
          pending[slot] = stream;
          uint64_t n = std::min(kStagingPieceBytes, reader.remaining());
          GPUSNAP_ASSIGN_OR_RETURN(void* buffer, staging.buffer(slot));
          GPUSNAP_RETURN_IF_ERROR(reader.Read(buffer, n));
          GPUSNAP_RETURN_IF_CU_ERROR(d, d.copy_htod_async(r.va + job.offset + off, buffer, n, stream), "cuMemcpyHtoDAsync");
          off += n;
        }
        return reader.Finish();
      });
}

unsigned ThreadsFromEnv(const char* name, unsigned fallback) {
  const char* v = std::getenv(name);
  int n = v ? std::atoi(v) : 0;
  return n >= 1 && n <= 64 ? static_cast<unsigned>(n) : fallback;
}

}  // namespace gpusnap::gpushare
