#include "chunks/chunk_manifest.h"

#include <cstring>

namespace gpusnap::chunks {

namespace {

constexpr uint8_t kKindZero = 0;
constexpr uint8_t kKindXxh3 = 1;
constexpr uint8_t kKindScratch = 2;  // version 3 on

template <typename T>
void Put(std::string& out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>(static_cast<uint64_t>(v) >> (8 * i)));
}

// Reads little-endian integers from a byte string; a read past the end sets truncated().
class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}

  template <typename T>
  T Get() {
    uint64_t v = 0;
    if (bytes_.size() - pos_ < sizeof(T)) {
      truncated_ = true;
      pos_ = bytes_.size();
      return T{};
    }
    for (size_t i = 0; i < sizeof(T); ++i) v |= uint64_t{static_cast<uint8_t>(bytes_[pos_ + i])} << (8 * i);
    pos_ += sizeof(T);
    return static_cast<T>(v);
  }
  void GetBytes(uint8_t* dest, size_t n) {
    if (bytes_.size() - pos_ < n) {
      truncated_ = true;
      pos_ = bytes_.size();
      return;
    }
    std::memcpy(dest, bytes_.data() + pos_, n);
    pos_ += n;
  }
  bool truncated() const { return truncated_; }
  size_t pos() const { return pos_; }
  size_t remaining() const { return bytes_.size() - pos_; }

 private:
  std::string_view bytes_;
  size_t pos_ = 0;
  bool truncated_ = false;
};

}  // namespace

std::string EncodeChunkManifest(const ChunkManifest& manifest) {
  bool scratch = false;
  for (const ChunkedAllocation& a : manifest.allocations)
    for (const ChunkRef& c : a.chunks) scratch = scratch || c.scratch;
  std::string out;
  Put<uint32_t>(out, kChunkManifestMagic);
  Put<uint32_t>(out, scratch ? kChunkManifestVersionScratch : 2);
  Put<uint32_t>(out, static_cast<uint32_t>(manifest.allocations.size()));
  for (const ChunkedAllocation& a : manifest.allocations) {
    Put<uint64_t>(out, a.va);
    Put<uint64_t>(out, a.size);
    Put<int32_t>(out, a.device);
    Put<uint8_t>(out, static_cast<uint8_t>(a.origin));
    out.append(reinterpret_cast<const char*>(a.device_uuid.data()), a.device_uuid.size());
    Put<uint32_t>(out, static_cast<uint32_t>(a.chunks.size()));
    for (const ChunkRef& c : a.chunks) {
      Put<uint8_t>(out, c.scratch ? kKindScratch : c.zero ? kKindZero : kKindXxh3);
      Put<uint64_t>(out, c.length);
      if (!c.zero) out.append(reinterpret_cast<const char*>(c.digest.data()), c.digest.size());
    }
  }
  return out;
}

Result<ChunkManifest> DecodeChunkManifest(std::string_view bytes, std::string_view source) {
  Reader r(bytes);
  auto truncated = [&] {
    return Status::Error(Code::kCorruption, "`{}` is truncated ({} bytes)", source, bytes.size());
  };
  uint32_t magic = r.Get<uint32_t>();
  if (r.truncated()) return truncated();
  if (magic != kChunkManifestMagic)
    return Status::Error(Code::kCorruption, "`{}` is not a chunk manifest (magic {:#010x}, expected {:#010x})",
                         source, magic, kChunkManifestMagic);
  uint32_t version = r.Get<uint32_t>();
  if (r.truncated()) return truncated();
  if (version < 1 || version > kChunkManifestVersion)
    return Status::Error(Code::kNotSupported, "`{}` has chunk manifest version {}; this gpusnap reads versions 1 to {}",
                         source, version, kChunkManifestVersion);
  uint32_t count = r.Get<uint32_t>();
  ChunkManifest m;
  for (uint32_t i = 0; i < count && !r.truncated(); ++i) {
    ChunkedAllocation a;
    a.va = r.Get<uint64_t>();
    a.size = r.Get<uint64_t>();
    a.device = r.Get<int32_t>();
    a.origin = AllocationOrigin::kUnknown;
    if (version >= 2) {
      uint8_t origin = r.Get<uint8_t>();
      if (!r.truncated() && origin != 0 && origin != 1)
        return Status::Error(Code::kCorruption, "`{}`: allocation {:#x} has unknown origin {}", source, a.va, origin);
      a.origin = static_cast<AllocationOrigin>(origin);
      r.GetBytes(a.device_uuid.data(), a.device_uuid.size());
    }
    uint32_t nchunks = r.Get<uint32_t>();
    uint64_t total = 0;
    for (uint32_t c = 0; c < nchunks && !r.truncated(); ++c) {
      ChunkRef ref;
      uint8_t kind = r.Get<uint8_t>();
      ref.length = r.Get<uint64_t>();
      if (r.truncated()) break;
      if (kind != kKindZero && kind != kKindXxh3 && (kind != kKindScratch || version < kChunkManifestVersionScratch))
        return Status::Error(Code::kCorruption, "`{}`: allocation {:#x} chunk {} has unknown kind {}", source, a.va, c,
                             kind);
      if (ref.length == 0 || ref.length > kChunkBytes)
        return Status::Error(Code::kCorruption, "`{}`: allocation {:#x} chunk {} has length {} (1..{} allowed)", source,
                             a.va, c, ref.length, kChunkBytes);
      ref.zero = kind == kKindZero || kind == kKindScratch;
      ref.scratch = kind == kKindScratch;
      if (!ref.zero) r.GetBytes(ref.digest.data(), ref.digest.size());
      total += ref.length;
      a.chunks.push_back(ref);
    }
    if (r.truncated()) break;
    if (total != a.size)
      return Status::Error(Code::kCorruption, "`{}`: allocation {:#x} has size {} but its chunks hold {} bytes", source,
                           a.va, a.size, total);
    m.allocations.push_back(std::move(a));
  }
  if (r.truncated()) return truncated();
  if (r.remaining() != 0)
    return Status::Error(Code::kCorruption, "`{}` has {} bytes after its last allocation", source, r.remaining());
  return m;
}

std::string ChunkManifestName(int pid) { return fmt::format("gpu/{}.chunks", pid); }

std::string SuspendedRoot(const std::string& store_root) { return store_root + "/suspended"; }

}  // namespace gpusnap::chunks
