// For unit tests: CRIU image files written as CRIU writes them (two magic
// words, then each entry as a 32-bit length and a protobuf message), from
// messages spelled out field by field. Header-only.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
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
inline constexpr uint32_t kPstreeMagic = 0x50273030;
inline constexpr uint32_t kCoreMagic = 0x55053847;
inline constexpr uint32_t kSeccompMagic = 0x64413049;

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

// pstree.img's entry of a process and its threads.
inline std::string Process(uint32_t pid, const std::vector<uint32_t>& threads) {
  std::string e = VarintField(1, pid) + VarintField(2, 0) + VarintField(3, pid) + VarintField(4, pid);
  for (uint32_t t : threads) e += VarintField(5, t);
  return e;
}

// creds.proto creds_entry's fields, as CRIU fills them.
struct CredsFields {
  uint32_t uid = 0, gid = 0, euid = 0, egid = 0, suid = 0, sgid = 0, fsuid = 0, fsgid = 0;
  uint64_t inh = 0, prm = 0, eff = 0, bnd = 0, amb = 0;
  std::vector<uint32_t> groups;
  uint32_t no_new_privs = 0;
  bool packed = false;  // the repeated fields as one packed array each (a writer may)
};

inline std::string Creds(const CredsFields& c) {
  auto repeated = [&c](int number, const std::vector<uint64_t>& values) {
    std::string out, packed;
    for (uint64_t v : values) (c.packed ? packed : out) += c.packed ? Varint(v) : VarintField(number, v);
    return c.packed ? BytesField(number, packed) : out;
  };
  auto caps = [&](int number, uint64_t set) { return repeated(number, {set & 0xffffffffu, set >> 32}); };
  std::string e = VarintField(1, c.uid) + VarintField(2, c.gid) + VarintField(3, c.euid) + VarintField(4, c.egid) +
                  VarintField(5, c.suid) + VarintField(6, c.sgid) + VarintField(7, c.fsuid) +
                  VarintField(8, c.fsgid) + caps(9, c.inh) + caps(10, c.prm) + caps(11, c.eff) + caps(12, c.bnd) +
                  VarintField(13, 0) + repeated(14, std::vector<uint64_t>(c.groups.begin(), c.groups.end())) +
                  VarintField(18, c.no_new_privs) + caps(19, c.amb);
  return e;
}

// core-<tid>.img's entry: task_core_entry (state 1 alive, 2 a zombie) and,
// for a live task, thread_core_entry with `creds` and the seccomp fields.
// `old_seccomp`: the mode and filter in task_core_entry instead, as older
// dumps have them.
inline std::string Core(const std::string& creds, const std::string& comm, std::optional<uint32_t> seccomp_mode = {},
                        std::optional<uint32_t> seccomp_filter = {}, uint32_t task_state = 1,
                        bool old_seccomp = false) {
  std::string seccomp;  // fields 11 and 12 in either message
  if (seccomp_mode) seccomp += VarintField(11, *seccomp_mode);
  if (seccomp_filter) seccomp += VarintField(12, *seccomp_filter);
  std::string tc = VarintField(1, task_state) + VarintField(2, 0) + VarintField(3, 0) + VarintField(4, 0) +
                   VarintField(5, 0) + BytesField(6, comm) + (old_seccomp ? seccomp : "");
  std::string out = VarintField(1, 1) + BytesField(3, tc);
  if (task_state == 2) return out;
  std::string thread = VarintField(1, 0) + VarintField(2, 0) + BytesField(10, creds) + (old_seccomp ? "" : seccomp) +
                       BytesField(13, comm);
  return out + BytesField(5, thread);
}

// seccomp.img's one entry, of filters made with SeccompFilter.
inline std::string SeccompFilters(const std::vector<std::string>& filters) {
  std::string e;
  for (const auto& f : filters) e += BytesField(1, f);
  return e;
}

inline std::string SeccompFilter(const std::string& program, std::optional<uint32_t> prev, uint32_t flags) {
  std::string f = BytesField(1, program);
  if (prev) f += VarintField(2, *prev);
  return f + VarintField(3, flags);
}

}  // namespace gpusnap::criu::testing
