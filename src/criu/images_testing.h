// For unit tests: CRIU image files written as CRIU writes them (two magic
// words, then each entry as a 32-bit length and a protobuf message), from
// messages spelled out field by field. Header-only.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace gpusnap::criu::testing {

inline std::string Varint(uint64_t v) {
  std::string out;
  do {
    uint8_t b = v & 0x7f;
    v >>= 7;
    out.push_back(static_cast<char>(v ? b | 0x80 : b));
  } while (v);
  return out;
}

inline std::string VarintField(int number, uint64_t value) {
  return Varint(static_cast<uint64_t>(number) << 3) + Varint(value);
}

inline std::string BytesField(int number, const std::string& bytes) {
  return Varint(static_cast<uint64_t>(number) << 3 | 2) + Varint(bytes.size()) + bytes;
}

inline std::string U32(uint32_t v) {
  std::string out(4, '\0');
  std::memcpy(out.data(), &v, 4);
  return out;
}

inline constexpr uint32_t kCommonMagic = 0x54564319;
inline constexpr uint32_t kFilesMagic = 0x56303138;
inline constexpr uint32_t kRemapFpathMagic = 0x59133954;
inline constexpr uint32_t kGhostFileMagic = 0x52583605;

inline std::string Image(uint32_t magic, const std::vector<std::string>& entries, const std::string& tail = "") {
  std::string out = U32(kCommonMagic) + U32(magic);
  for (const auto& e : entries) out += U32(static_cast<uint32_t>(e.size())) + e;
  return out + tail;
}

// files.img's entry of a regular file (fdinfo.proto file_entry, type REG).
inline std::string RegularFile(uint32_t id, const std::string& name) {
  std::string reg = VarintField(1, id) + VarintField(2, 02) + VarintField(3, 0) + BytesField(5, "") +
                    BytesField(6, name);
  return VarintField(1, 1) + VarintField(2, id) + BytesField(3, reg);
}

// remap-fpath.img's entry (type 0 linked, 1 ghost; -1: none written).
inline std::string Remap(uint32_t orig_id, uint32_t remap_id, int type) {
  std::string e = VarintField(1, orig_id) + VarintField(2, remap_id);
  if (type >= 0) e += VarintField(3, static_cast<uint64_t>(type));
  return e;
}

// ghost-file-<id>.img's first entry, with `mode`.
inline std::string Ghost(uint32_t mode) { return VarintField(1, 0) + VarintField(2, 0) + VarintField(3, mode); }

}  // namespace gpusnap::criu::testing
