// The gpushare chunk store: device memory saved as content-addressed chunks.
//
// An allocation's bytes are cut into kChunkBytes (64 MiB) chunks; the last may
// be shorter. A chunk of only zero bytes is not stored (its ref says ZERO).
// Any other chunk is named by the XXH3-128 of its bytes, as 32 lowercase hex
// digits, and lives at <root>/chunks/<first 2 hex>/<32 hex>. A chunk whose
// file exists is not written again, so identical chunks (the same weights in
// two processes or two snapshots) are stored once.
//
// Each chunk file is written to a temporary sibling, fdatasync'd, renamed into
// place, and its directory fsync'd: a crash leaves a whole chunk or none.
// Writes are buffered by default, so a restore on the same node right after a
// checkpoint (scale to zero and back) reads the chunks from the page cache;
// with DirectIo::kOn they bypass it (O_DIRECT where the filesystem allows it),
// for nodes whose page cache must not fill with device memory.
//
// Last use. A collection may keep chunks that no manifest names, up to a
// limit, evicting the least recently used first (chunk_gc.h). A chunk
// file's mtime is its last use: set when the chunk is written (the rename keeps
// the temporary's), and set to now when a save finds the chunk stored already,
// when a reader opens it (ChunkReader::Open, through which Load and every fill
// of device memory read: the shim's and gpusnap's preload), and by MarkUsed
// (a pull that finds the chunk present). Why the mtime: atime is not kept
// under noatime and only coarsely under relatime, and a marker file per chunk
// would double the inodes and be one more file to create and collect. Nothing
// else reads a chunk's mtime: its bytes never change after the rename (they
// are its name), and the collection's age rule is for temporaries, which no
// reader opens. A mark is one futimens/utimensat, on the descriptor already
// open where there is one, and never synced: a mark lost to a crash only makes
// the chunk look older. Setting a file's times takes its owner (the shim that
// wrote it) or root (gpusnap); where neither holds (a workload of another uid
// reading chunks written by root, a read-only mount), the mark is skipped and
// the operation goes on.
//
// The manifest (gpu/<pid>.chunks) lists, per allocation, VA, size, device
// ordinal and the ordered chunk refs; its byte format is in chunk_manifest.h.
//
// Thread-safety: a ChunkStore is immutable after Open; Save and Load may run
// concurrently from many threads and processes on the same root.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpusnap/status.h"
#include "util/fd.h"

namespace gpusnap::chunks {

inline constexpr uint64_t kChunkBytes = 64ull << 20;
// A chunk is written to <chunk file><kChunkTempInfix><pid>-<16 hex> first.
inline constexpr std::string_view kChunkTempInfix = ".tmp-";

// <store_root>/chunks: the fan-out directories of the chunk files.
std::string ChunksDir(const std::string& store_root);

using ChunkDigest = std::array<uint8_t, 16>;  // XXH3-128, high 64 bits first (big-endian)

// One chunk of an allocation: ZERO (all bytes zero, not stored) or a digest.
// A SCRATCH chunk is one the workload marked as needing no saving
// (gpusnap/gpushare_scratch.h): not read at release, not stored, and zeroed at
// load; it is a ZERO chunk too (`zero` is true), so whatever only asks whether
// a chunk is stored treats it as one.
struct ChunkRef {
  bool zero = false;
  ChunkDigest digest{};  // meaningful only when !zero
  uint64_t length = 0;   // 1..kChunkBytes
  bool scratch = false;  // REQUIRES zero

  bool operator==(const ChunkRef&) const = default;
};

// Who made an allocation: the shim (the application's cuMemAlloc), or the
// application itself (its own VMM object: NCCL's buffers). Manifests of
// version 1 do not say.
enum class AllocationOrigin : uint8_t { kShim = 0, kApplication = 1, kUnknown = 2 };

// One device allocation. The chunk lengths sum to `size`.
struct ChunkedAllocation {
  uint64_t va = 0;
  uint64_t size = 0;
  int32_t device = 0;  // CUDA device ordinal, as the process saw it
  std::vector<ChunkRef> chunks;
  AllocationOrigin origin = AllocationOrigin::kShim;
  std::array<uint8_t, 16> device_uuid{};  // that device's UUID; zero in version 1

  bool operator==(const ChunkedAllocation&) const = default;
};

// The 32 hex digits of a digest.
std::string DigestHex(const ChunkDigest& digest);
// Pure. The digest 32 lower-case hex digits name; nullopt for anything else.
std::optional<ChunkDigest> ParseDigestHex(std::string_view hex);

// XXH3-128 of `size` bytes at `data`.
ChunkDigest ComputeChunkDigest(const void* data, uint64_t size);

// True if all `size` bytes at `data` are zero.
bool IsAllZero(const void* data, uint64_t size);

// What a Save did, for logs and tests.
struct SaveStats {
  uint64_t chunks_written = 0;  // new chunk files
  uint64_t chunks_present = 0;  // already stored (deduplicated)
  uint64_t chunks_zero = 0;     // all-zero, not stored
  uint64_t bytes_written = 0;
};

class ChunkStore {
 public:
  // Opens the store at `root`, creating <root>/chunks if missing. kIoError
  // naming the directory if it cannot be created.
  enum class DirectIo { kOff, kOn };
  // DirectIo::kOn when $GPUSNAP_CHUNK_DIRECT_IO is 1.
  static DirectIo DirectIoFromEnv();
  static Result<ChunkStore> Open(const std::string& root, DirectIo direct_io = DirectIoFromEnv());

  const std::string& root() const { return root_; }
  // <root>/chunks/<first 2 hex>/<32 hex>
  std::string ChunkPath(const ChunkDigest& digest) const;

  // This store, whose readers wait up to `wait` for a chunk file that is not
  // there yet: one a pull is still bringing (it appears whole, by rename).
  // They stop waiting with `bringer`'s failure once it reports one, and with
  // kTimeout naming the chunk once the wait is over. Default: no wait.
  using Bringer = std::function<Status()>;
  ChunkStore WithArrivalWait(std::chrono::milliseconds wait, Bringer bringer) const {
    ChunkStore c = *this;
    c.arrival_wait_ = wait;
    c.bringer_ = std::move(bringer);
    return c;
  }
  std::chrono::milliseconds arrival_wait() const { return arrival_wait_; }
  Status BringerStatus() const { return bringer_ ? bringer_() : Status::Ok(); }

  // Cuts `size` bytes at `data` into chunks and stores the ones that are
  // neither zero nor present. Returns the allocation (va, size, device and
  // its chunk refs). REQUIRES: `data` readable for `size` bytes (any
  // alignment; size 0 gives an empty chunk list). `stats`, if not null, is
  // incremented. Errors: kIoError (or the errno's code) naming the chunk file.
  Result<ChunkedAllocation> Save(const void* data, uint64_t size, uint64_t va, int32_t device,
                                 SaveStats* stats = nullptr) const;

  // Fills `dest` (the caller's host buffer, `dest_size` bytes) with the
  // allocation's bytes: ZERO chunks with zeros, the others read from their
  // files and checked against their digest, `threads` chunks at a time (0 or
  // 1: on the calling thread). REQUIRES: `dest` writable for `dest_size`.
  // Errors: kInvalidArgument if dest_size != alloc.size or the chunk lengths
  // do not sum to it; kNotFound naming a missing chunk file; kCorruption
  // naming a chunk file of the wrong size or digest. On error the content of
  // `dest` is unspecified.
  Status Load(const ChunkedAllocation& alloc, void* dest, uint64_t dest_size, unsigned threads = 1) const;

  // Marks the stored chunk `digest` used now (its mtime, see the top of this
  // file), if it is there and this process may; a chunk that is not there
  // stays absent. Best effort by design: a mark that cannot be made never
  // fails the read or pull that makes it, so this reports nothing.
  void MarkUsed(const ChunkDigest& digest) const;
  // Whether the chunk `ref` names is stored with its length (a ZERO chunk is
  // never stored, and always held); marks a stored one used, as a save that
  // finds it present does. A release that knows a chunk's bytes unchanged
  // asks this instead of saving it again: a collection may have taken it.
  bool Holds(const ChunkRef& ref) const;

  // One chunk at a time, for callers that stage chunks through their own
  // buffers (the shim's pinned staging): stores `length` bytes
  // (1..kChunkBytes) unless they are zero or present and returns the ref.
  // Errors as Save. (Such callers read chunks back with ChunkReader, below.)
  Result<ChunkRef> SaveChunk(const void* data, uint64_t length, SaveStats* stats = nullptr) const;

 private:
  ChunkStore(std::string root, DirectIo direct_io) : root_(std::move(root)), direct_io_(direct_io) {}
  Status WriteChunk(const ChunkDigest& digest, const void* data, uint64_t size, bool* written) const;
  Status ReadChunk(const ChunkRef& ref, char* dest) const;
  std::string root_;
  DirectIo direct_io_ = DirectIo::kOff;
  std::chrono::milliseconds arrival_wait_{0};
  Bringer bringer_;
};

// Reads one stored chunk in pieces and checks its digest as the bytes go by:
// Open, Read the pieces in order, Finish. For callers that pass each piece on
// (a copy to the GPU) while they read the next. A caller must not trust the
// bytes until Finish says OK.
class ChunkReader {
 public:
  // Marks the chunk used (see the top of this file). kNotFound naming a
  // missing chunk file; kCorruption for one of the wrong size.
  // REQUIRES: !ref.zero.
  static Result<ChunkReader> Open(const ChunkStore& store, const ChunkRef& ref);
  ChunkReader(ChunkReader&&) noexcept;
  ChunkReader& operator=(ChunkReader&&) noexcept;
  ~ChunkReader();

  uint64_t remaining() const { return ref_.length - offset_; }
  // The next `length` bytes (at most remaining()) into `dest`.
  Status Read(void* dest, uint64_t length);
  // kCorruption unless every byte was read and the digest matches.
  Status Finish();

 private:
  ChunkReader(UniqueFd fd, std::string path, ChunkRef ref, void* state)
      : fd_(std::move(fd)), path_(std::move(path)), ref_(ref), state_(state) {}
  UniqueFd fd_;
  std::string path_;
  ChunkRef ref_;
  uint64_t offset_ = 0;
  void* state_ = nullptr;  // XXH3_state_t*
};

}  // namespace gpusnap::chunks
