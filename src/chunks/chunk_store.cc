#include "chunks/chunk_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <utility>
#include <cstring>
#include <memory>
#include <random>
#include <thread>

// Header-only use of libxxhash: gpusnap links nothing for it.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "util/fd.h"
#include "util/files.h"
#include "util/first_failure.h"

namespace gpusnap::chunks {

namespace {

// O_DIRECT wants the buffer, the offset and the length aligned; 4 KiB covers
// every block device in use.
constexpr uint64_t kDirectAlign = 4096;
constexpr uint64_t kZeroBlock = 64 << 10;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<char, FreeDeleter>;

uint64_t RoundUp(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

Status WriteAll(int fd, const char* p, uint64_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return Status::Errno(w < 0 ? errno : EIO, "writing `{}`", path);
    p += w;
    n -= static_cast<uint64_t>(w);
  }
  return Status::Ok();
}

std::string TempSuffix() {
  std::random_device rd;
  return fmt::format("{}{}-{:08x}{:08x}", kChunkTempInfix, ::getpid(), rd(), rd());
}

// Writes `size` bytes with O_DIRECT: aligned whole blocks from an aligned
// copy, the last block zero-padded, then truncated to `size`.
Status WriteDirect(int fd, const void* data, uint64_t size, const std::string& path) {
  constexpr uint64_t kStage = 8 << 20;
  AlignedBuffer buf(static_cast<char*>(std::aligned_alloc(kDirectAlign, kStage)));
  if (!buf) return Status::Error(Code::kInternal, "no memory for an O_DIRECT buffer writing `{}`", path);
  const char* src = static_cast<const char*>(data);
  for (uint64_t off = 0; off < size;) {
    uint64_t n = std::min(kStage, size - off);
    std::memcpy(buf.get(), src + off, n);
    uint64_t padded = RoundUp(n, kDirectAlign);
    std::memset(buf.get() + n, 0, padded - n);
    GPUSNAP_RETURN_IF_ERROR(WriteAll(fd, buf.get(), padded, path));
    off += n;
  }
  if (size % kDirectAlign != 0 && ::ftruncate(fd, static_cast<off_t>(size)) != 0)
    return Status::Errno(errno, "truncating `{}`", path);
  return Status::Ok();
}

// The mark of a use (chunk_store.h): both times to now, which the owner, root
// or a writer of the file may set (an explicit time would take the owner).
// Failure is not an error of the caller's (see MarkUsed).
void MarkUsedFd(int fd) { (void)::futimens(fd, nullptr); }
void MarkUsedPath(const std::string& path) { (void)::utimensat(AT_FDCWD, path.c_str(), nullptr, 0); }

}  // namespace

std::string DigestHex(const ChunkDigest& digest) {
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (uint8_t c : digest) {
    s.push_back(kHex[c >> 4]);
    s.push_back(kHex[c & 15]);
  }
  return s;
}

std::optional<ChunkDigest> ParseDigestHex(std::string_view hex) {
  if (hex.size() != 32) return std::nullopt;
  ChunkDigest d{};
  for (size_t i = 0; i < 32; ++i) {
    char c = hex[i];
    int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (v < 0) return std::nullopt;
    d[i / 2] = static_cast<uint8_t>(d[i / 2] | (i % 2 == 0 ? v << 4 : v));
  }
  return d;
}

ChunkDigest ComputeChunkDigest(const void* data, uint64_t size) {
  XXH128_canonical_t canon;
  XXH128_canonicalFromHash(&canon, XXH3_128bits(data, size));
  ChunkDigest d;
  static_assert(sizeof(canon.digest) == d.size());
  std::memcpy(d.data(), canon.digest, d.size());
  return d;
}

bool IsAllZero(const void* data, uint64_t size) {
  alignas(64) static const char kZeros[kZeroBlock] = {};
  const char* p = static_cast<const char*>(data);
  for (uint64_t off = 0; off < size; off += kZeroBlock) {
    if (std::memcmp(p + off, kZeros, std::min(kZeroBlock, size - off)) != 0) return false;
  }
  return true;
}

ChunkStore::DirectIo ChunkStore::DirectIoFromEnv() {
  const char* v = std::getenv("GPUSNAP_CHUNK_DIRECT_IO");
  return v != nullptr && std::string_view(v) == "1" ? DirectIo::kOn : DirectIo::kOff;
}

std::string ChunksDir(const std::string& store_root) { return store_root + "/chunks"; }

Result<ChunkStore> ChunkStore::Open(const std::string& root, DirectIo direct_io) {
  GPUSNAP_RETURN_IF_ERROR(MakeDirs(ChunksDir(root)));
  return ChunkStore(root, direct_io);
}

std::string ChunkStore::ChunkPath(const ChunkDigest& digest) const {
  std::string hex = DigestHex(digest);
  return ChunksDir(root_) + "/" + hex.substr(0, 2) + "/" + hex;
}

Status ChunkStore::WriteChunk(const ChunkDigest& digest, const void* data, uint64_t size, bool* written) const {
  *written = false;
  std::string path = ChunkPath(digest);
  struct stat st{};
  if (::stat(path.c_str(), &st) == 0) {  // stored already: a use of it
    MarkUsedPath(path);
    return Status::Ok();
  }
  std::string dir = path.substr(0, path.rfind('/'));
  if (::mkdir(dir.c_str(), 0755) == 0) {
    GPUSNAP_RETURN_IF_ERROR(FsyncPath(ChunksDir(root_)));
  } else if (errno != EEXIST) {
    return Status::Errno(errno, "creating directory `{}`", dir);
  }

  std::string tmp = path + TempSuffix();
  constexpr int kFlags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
  bool want_direct = direct_io_ == DirectIo::kOn;
  UniqueFd fd(::open(tmp.c_str(), kFlags | (want_direct ? O_DIRECT : 0), 0644));
  bool direct = fd.valid() && want_direct;
  if (!fd.valid() && want_direct && errno == EINVAL) fd.Reset(::open(tmp.c_str(), kFlags, 0644));  // no O_DIRECT here
  if (!fd.valid()) return Status::Errno(errno, "creating chunk `{}`", tmp);

  Status st_write = direct ? WriteDirect(fd.get(), data, size, tmp) : Status::Ok();
  if (direct && st_write.sys_errno() == EINVAL) {
    // The filesystem took the flag at open but refuses the I/O: start over buffered.
    direct = false;
    st_write = Status::Ok();
    if (::fcntl(fd.get(), F_SETFL, 0) != 0 || ::ftruncate(fd.get(), 0) != 0 || ::lseek(fd.get(), 0, SEEK_SET) != 0)
      st_write = Status::Errno(errno, "leaving O_DIRECT on `{}`", tmp);
  }
  if (!direct && st_write.ok()) st_write = WriteAll(fd.get(), static_cast<const char*>(data), size, tmp);
  if (st_write.ok() && ::fdatasync(fd.get()) != 0) st_write = Status::Errno(errno, "syncing `{}`", tmp);
  if (st_write.ok() && ::rename(tmp.c_str(), path.c_str()) != 0)
    st_write = Status::Errno(errno, "renaming `{}` to `{}`", tmp, path);
  if (!st_write.ok()) {
    ::unlink(tmp.c_str());
    return st_write;
  }
  GPUSNAP_RETURN_IF_ERROR(FsyncPath(dir));
  *written = true;
  return Status::Ok();
}

void ChunkStore::MarkUsed(const ChunkDigest& digest) const { MarkUsedPath(ChunkPath(digest)); }

bool ChunkStore::Holds(const ChunkRef& ref) const {
  if (ref.zero) return true;
  std::string path = ChunkPath(ref.digest);
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != ref.length)
    return false;
  MarkUsedPath(path);
  return true;
}

Result<ChunkRef> ChunkStore::SaveChunk(const void* data, uint64_t length, SaveStats* stats) const {
  ChunkRef ref;
  ref.length = length;
  SaveStats local;
  if (IsAllZero(data, length)) {
    ref.zero = true;
    ++local.chunks_zero;
  } else {
    ref.digest = ComputeChunkDigest(data, length);
    bool written = false;
    GPUSNAP_RETURN_IF_ERROR(WriteChunk(ref.digest, data, length, &written));
    ++(written ? local.chunks_written : local.chunks_present);
    if (written) local.bytes_written += length;
  }
  if (stats) {
    stats->chunks_written += local.chunks_written;
    stats->chunks_present += local.chunks_present;
    stats->chunks_zero += local.chunks_zero;
    stats->bytes_written += local.bytes_written;
  }
  return ref;
}

Result<ChunkedAllocation> ChunkStore::Save(const void* data, uint64_t size, uint64_t va, int32_t device,
                                           SaveStats* stats) const {
  ChunkedAllocation alloc;
  alloc.va = va;
  alloc.size = size;
  alloc.device = device;
  const char* p = static_cast<const char*>(data);
  for (uint64_t off = 0; off < size; off += kChunkBytes) {
    auto ref = SaveChunk(p + off, std::min(kChunkBytes, size - off), stats);
    if (!ref.ok()) return ref.status().Wrap(fmt::format("saving allocation {:#x} chunk at offset {}", va, off));
    alloc.chunks.push_back(*ref);
  }
  return alloc;
}

Status ChunkStore::ReadChunk(const ChunkRef& ref, char* dest) const {
  if (ref.zero) {
    std::memset(dest, 0, ref.length);
    return Status::Ok();
  }
  GPUSNAP_ASSIGN_OR_RETURN(ChunkReader reader, ChunkReader::Open(*this, ref));
  GPUSNAP_RETURN_IF_ERROR(reader.Read(dest, ref.length));
  return reader.Finish();
}

Status ChunkStore::Load(const ChunkedAllocation& alloc, void* dest, uint64_t dest_size, unsigned threads) const {
  if (dest_size != alloc.size)
    return Status::Error(Code::kInvalidArgument, "loading allocation {:#x}: buffer of {} bytes for {} bytes", alloc.va,
                         dest_size, alloc.size);
  std::vector<uint64_t> offsets;
  uint64_t total = 0;
  for (const ChunkRef& ref : alloc.chunks) {
    offsets.push_back(total);
    total += ref.length;
  }
  if (total != alloc.size)
    return Status::Error(Code::kInvalidArgument, "loading allocation {:#x}: chunks hold {} bytes, size is {}",
                         alloc.va, total, alloc.size);

  char* out = static_cast<char*>(dest);
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  FirstFailure failure;
  auto work = [&] {
    for (size_t i; !failed.load() && (i = next.fetch_add(1)) < alloc.chunks.size();) {
      Status st = ReadChunk(alloc.chunks[i], out + offsets[i]);
      if (!st.ok()) {
        failure.Record(st.Wrap(fmt::format("loading allocation {:#x} chunk {}", alloc.va, i)));
        failed = true;
        return;
      }
    }
  };
  unsigned n = static_cast<unsigned>(std::min<size_t>(std::max(1u, threads), std::max<size_t>(1, alloc.chunks.size())));
  std::vector<std::thread> pool;
  for (unsigned i = 1; i < n; ++i) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  return failure.Get();
}

Result<ChunkReader> ChunkReader::Open(const ChunkStore& store, const ChunkRef& ref) {
  std::string path = store.ChunkPath(ref.digest);
  int raw = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  int open_errno = errno;  // before anything else can set it
  if (raw < 0 && open_errno == ENOENT && store.arrival_wait().count() > 0) {
    auto deadline = std::chrono::steady_clock::now() + store.arrival_wait();
    while (raw < 0 && open_errno == ENOENT && std::chrono::steady_clock::now() < deadline) {
      GPUSNAP_RETURN_IF_ERROR(store.BringerStatus().Wrap(fmt::format("chunk `{}` will not arrive", path)));
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      raw = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      open_errno = errno;
    }
    if (raw < 0 && open_errno == ENOENT)
      return Status::Error(Code::kTimeout, "chunk `{}` did not arrive within {} ms", path, store.arrival_wait().count());
  }
  if (raw < 0) return Status::Errno(open_errno, "opening chunk `{}`", path);
  UniqueFd fd(raw);
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0) return Status::Errno(errno, "reading chunk `{}`", path);
  if (static_cast<uint64_t>(st.st_size) != ref.length)
    return Status::Error(Code::kCorruption, "chunk `{}` has {} bytes, expected {}", path, st.st_size, ref.length);
  MarkUsedFd(fd.get());
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr) return Status::Error(Code::kInternal, "out of memory for a digest state");
  XXH3_128bits_reset(state);
  return ChunkReader(std::move(fd), std::move(path), ref, state);
}

ChunkReader::ChunkReader(ChunkReader&& o) noexcept
    : fd_(std::move(o.fd_)), path_(std::move(o.path_)), ref_(o.ref_), offset_(o.offset_),
      state_(std::exchange(o.state_, nullptr)) {}

ChunkReader& ChunkReader::operator=(ChunkReader&& o) noexcept {
  if (this != &o) {
    if (state_) XXH3_freeState(static_cast<XXH3_state_t*>(state_));
    fd_ = std::move(o.fd_);
    path_ = std::move(o.path_);
    ref_ = o.ref_;
    offset_ = o.offset_;
    state_ = std::exchange(o.state_, nullptr);
  }
  return *this;
}

ChunkReader::~ChunkReader() {
  if (state_) XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}

Status ChunkReader::Read(void* dest, uint64_t length) {
  if (length > remaining())
    return Status::Error(Code::kInvalidArgument, "reading {} bytes past the end of chunk `{}`", length, path_);
  char* p = static_cast<char*>(dest);
  for (uint64_t done = 0; done < length;) {
    ssize_t r = ::pread(fd_.get(), p + done, length - done, static_cast<off_t>(offset_ + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::Errno(errno, "reading chunk `{}`", path_);
    if (r == 0) return Status::Error(Code::kCorruption, "chunk `{}` is truncated at {} bytes", path_, offset_ + done);
    done += static_cast<uint64_t>(r);
  }
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), p, length);
  offset_ += length;
  return Status::Ok();
}

Status ChunkReader::Finish() {
  if (remaining() != 0)
    return Status::Error(Code::kInvalidArgument, "chunk `{}` finished with {} bytes unread", path_, remaining());
  XXH128_canonical_t canon;
  XXH128_canonicalFromHash(&canon, XXH3_128bits_digest(static_cast<XXH3_state_t*>(state_)));
  ChunkDigest d;
  std::memcpy(d.data(), canon.digest, d.size());
  if (d != ref_.digest) return Status::Error(Code::kCorruption, "chunk `{}` does not match its digest", path_);
  return Status::Ok();
}

}  // namespace gpusnap::chunks
