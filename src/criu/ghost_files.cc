#include "criu/ghost_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <google/protobuf/unknown_field_set.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <string_view>

#include "util/fd.h"
#include "util/files.h"

namespace gpusnap::criu {

namespace {

using google::protobuf::UnknownField;
using google::protobuf::UnknownFieldSet;

// A message's fields by number (the first of each), as the wire has them.
struct Message {
  std::map<int, uint64_t> varints;
  std::map<int, std::string> bytes;

  std::optional<uint64_t> Varint(int number) const {
    auto it = varints.find(number);
    return it == varints.end() ? std::nullopt : std::optional<uint64_t>(it->second);
  }
  std::optional<std::string> Bytes(int number) const {
    auto it = bytes.find(number);
    return it == bytes.end() ? std::nullopt : std::optional<std::string>(it->second);
  }
};

std::optional<Message> Parse(std::string_view wire) {
  UnknownFieldSet set;
  if (!set.ParseFromArray(wire.data(), static_cast<int>(wire.size()))) return std::nullopt;
  Message m;
  for (int i = 0; i < set.field_count(); ++i) {
    const UnknownField& f = set.field(i);
    if (f.type() == UnknownField::TYPE_VARINT) m.varints.emplace(f.number(), f.varint());
    if (f.type() == UnknownField::TYPE_LENGTH_DELIMITED) m.bytes.emplace(f.number(), f.length_delimited());
  }
  return m;
}

// criu/include/magic.h: the word every image starts with, then its own.
constexpr uint32_t kCommonMagic = 0x54564319;
constexpr uint32_t kServiceMagic = 0x55105940;
constexpr uint32_t kFilesMagic = 0x56303138;
constexpr uint32_t kRegFilesMagic = 0x50363636;
constexpr uint32_t kRemapFpathMagic = 0x59133954;
constexpr uint32_t kGhostFileMagic = 0x52583605;

// images/fdinfo.proto file_entry: type (REG = 1), reg.
constexpr int kFileEntryType = 1;
constexpr int kFileEntryReg = 3;
constexpr uint64_t kFdTypeReg = 1;
// images/regfile.proto reg_file_entry: id, name.
constexpr int kRegFileId = 1;
constexpr int kRegFileName = 6;
// images/remap-file-path.proto remap_file_path_entry: orig_id, remap_id,
// remap_type (GHOST = 1); images without a type mark a ghost in remap_id.
constexpr int kRemapOrigId = 1;
constexpr int kRemapId = 2;
constexpr int kRemapType = 3;
constexpr uint64_t kRemapTypeGhost = 1;
constexpr uint32_t kRemapGhostBit = 0x80000000u;
// images/ghost-file.proto ghost_file_entry: mode.
constexpr int kGhostMode = 3;

uint32_t ReadU32(std::string_view bytes, size_t at) {
  uint32_t v;
  std::memcpy(&v, bytes.data() + at, sizeof v);
  return v;  // in the order of the host that wrote it, as CRIU reads it
}

// The bytes after an image's magic words, or why they are not CRIU's `magic`.
Result<std::string_view> Body(std::string_view image, uint32_t magic, const std::string& path) {
  if (image.size() < 4) return Status::Error(Code::kCorruption, "CRIU image `{}` is too short for its magic", path);
  size_t at = 4;
  uint32_t first = ReadU32(image, 0);
  if (first == kCommonMagic || first == kServiceMagic) {
    if (image.size() < 8) return Status::Error(Code::kCorruption, "CRIU image `{}` is too short for its magic", path);
    first = ReadU32(image, 4);
    at = 8;
  }
  if (first != magic)
    return Status::Error(Code::kCorruption, "CRIU image `{}` has magic {:#x}, not {:#x}", path, first, magic);
  return image.substr(at);
}

// The entries of an image body, which starts at byte `base` of the file: each
// a length and a message.
Result<std::vector<Message>> Entries(std::string_view body, size_t base, const std::string& path) {
  std::vector<Message> out;
  size_t at = 0;
  while (at < body.size()) {
    if (body.size() - at < 4)
      return Status::Error(Code::kCorruption, "CRIU image `{}` ends inside an entry's length (at byte {})", path,
                           base + at);
    uint32_t len = ReadU32(body, at);
    at += 4;
    if (body.size() - at < len)
      return Status::Error(Code::kCorruption, "CRIU image `{}`: an entry of {} bytes at byte {} runs past its end",
                           path, len, base + at);
    auto entry = Parse(body.substr(at, len));
    if (!entry)
      return Status::Error(Code::kCorruption, "CRIU image `{}`: the entry at byte {} is not a protobuf message", path,
                           base + at);
    out.push_back(std::move(*entry));
    at += len;
  }
  return out;
}

Result<std::vector<Message>> ReadImage(const std::string& path, uint32_t magic) {
  GPUSNAP_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  GPUSNAP_ASSIGN_OR_RETURN(std::string_view body, Body(text, magic, path));
  return Entries(body, text.size() - body.size(), path);
}

// Regular files' paths by id: files.img, or reg-files.img of older dumps.
Result<std::map<uint32_t, std::string>> RegularFiles(const std::string& dir) {
  std::map<uint32_t, std::string> paths;
  auto add = [&](const Message& reg, const std::string& path) -> Status {
    auto id = reg.Varint(kRegFileId);
    auto name = reg.Bytes(kRegFileName);
    if (!id || !name)
      return Status::Error(Code::kCorruption, "CRIU image `{}`: a regular file without id or name", path);
    paths[static_cast<uint32_t>(*id)] = *name;
    return Status::Ok();
  };
  std::string files = dir + "/files.img";
  if (::access(files.c_str(), F_OK) == 0) {
    GPUSNAP_ASSIGN_OR_RETURN(auto entries, ReadImage(files, kFilesMagic));
    for (const auto& e : entries) {
      if (e.Varint(kFileEntryType) != kFdTypeReg) continue;
      auto reg = e.Bytes(kFileEntryReg);
      auto parsed = reg ? Parse(*reg) : std::nullopt;
      if (!parsed)
        return Status::Error(Code::kCorruption, "CRIU image `{}`: a regular file's entry is missing or malformed",
                             files);
      GPUSNAP_RETURN_IF_ERROR(add(*parsed, files));
    }
    return paths;
  }
  std::string reg_files = dir + "/reg-files.img";
  GPUSNAP_ASSIGN_OR_RETURN(auto entries, ReadImage(reg_files, kRegFilesMagic));
  for (const auto& e : entries) GPUSNAP_RETURN_IF_ERROR(add(e, reg_files));
  return paths;
}

// A ghost image's first entry (the file's metadata; its contents follow).
Result<Message> GhostEntry(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return Status::Errno(errno, "opening `{}`", path);
  std::string head(12, '\0');
  ssize_t n = ::pread(fd.get(), head.data(), head.size(), 0);
  if (n < 0) return Status::Errno(errno, "reading `{}`", path);
  head.resize(static_cast<size_t>(n));
  GPUSNAP_ASSIGN_OR_RETURN(std::string_view body, Body(head, kGhostFileMagic, path));
  if (body.size() < 4) return Status::Error(Code::kCorruption, "CRIU image `{}` holds no ghost file entry", path);
  uint32_t len = ReadU32(body, 0);
  if (len > (1u << 20)) return Status::Error(Code::kCorruption, "CRIU image `{}`: a {}-byte ghost entry", path, len);
  std::string entry(len, '\0');
  n = ::pread(fd.get(), entry.data(), len, static_cast<off_t>(head.size()));
  if (n != static_cast<ssize_t>(len))
    return n < 0 ? Status::Errno(errno, "reading `{}`", path)
                 : Status::Error(Code::kCorruption, "CRIU image `{}` ends inside its ghost entry", path);
  auto parsed = Parse(entry);
  if (!parsed)
    return Status::Error(Code::kCorruption, "CRIU image `{}`: its ghost entry is not a protobuf message", path);
  return *parsed;
}

}  // namespace

std::string GhostFile::RestorePath() const { return directory ? path : fmt::format("{}.cr.{:x}.ghost", path, id); }

Result<std::vector<GhostFile>> ReadGhostFiles(const std::string& images_dir) {
  std::string remaps = images_dir + "/remap-fpath.img";
  if (::access(remaps.c_str(), F_OK) != 0) return std::vector<GhostFile>{};
  GPUSNAP_ASSIGN_OR_RETURN(auto entries, ReadImage(remaps, kRemapFpathMagic));
  std::optional<std::map<uint32_t, std::string>> files;  // read once a ghost needs it
  std::vector<GhostFile> out;
  for (const auto& e : entries) {
    auto orig = e.Varint(kRemapOrigId);
    auto remap = e.Varint(kRemapId);
    if (!orig || !remap)
      return Status::Error(Code::kCorruption, "CRIU image `{}`: an entry without orig_id or remap_id", remaps);
    auto id = static_cast<uint32_t>(*remap);
    auto type = e.Varint(kRemapType);
    bool ghost = type ? *type == kRemapTypeGhost : (id & kRemapGhostBit) != 0;
    if (!ghost) continue;
    if (!type) id &= ~kRemapGhostBit;
    // Each open of a file has its entry; CRIU makes the ghost once, at the first one's path.
    if (std::any_of(out.begin(), out.end(), [id](const GhostFile& g) { return g.id == id; })) continue;
    if (!files) {
      GPUSNAP_ASSIGN_OR_RETURN(files, RegularFiles(images_dir));
    }
    auto named = files->find(static_cast<uint32_t>(*orig));
    if (named == files->end())
      return Status::Error(Code::kCorruption, "CRIU image `{}`: ghost {:#x} is of file {:#x}, which no image names",
                           remaps, id, *orig);
    GPUSNAP_ASSIGN_OR_RETURN(Message ghost_entry,
                             GhostEntry(fmt::format("{}/ghost-file-{:x}.img", images_dir, id)));
    auto mode = ghost_entry.Varint(kGhostMode);
    out.push_back({.id = id, .path = named->second, .directory = mode && S_ISDIR(static_cast<mode_t>(*mode))});
  }
  return out;
}

}  // namespace gpusnap::criu
