#include "criu/ghost_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <string_view>

#include "criu/image_reader.h"
#include "util/fd.h"

namespace gpusnap::criu {

namespace {

// criu/include/magic.h.
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

// Regular files' paths by id: files.img, or reg-files.img of older dumps.
Result<std::map<uint32_t, std::string>> RegularFiles(const std::string& dir) {
  std::map<uint32_t, std::string> paths;
  auto add = [&](const ImageMessage& reg, const std::string& path) -> Status {
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
      auto parsed = reg ? ParseImageMessage(*reg) : std::nullopt;
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
Result<ImageMessage> GhostEntry(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return Status::Errno(errno, "opening `{}`", path);
  std::string head(12, '\0');
  ssize_t n = ::pread(fd.get(), head.data(), head.size(), 0);
  if (n < 0) return Status::Errno(errno, "reading `{}`", path);
  head.resize(static_cast<size_t>(n));
  GPUSNAP_ASSIGN_OR_RETURN(std::string_view body, ImageBody(head, kGhostFileMagic, path));
  if (body.size() < 4) return Status::Error(Code::kCorruption, "CRIU image `{}` holds no ghost file entry", path);
  uint32_t len = ImageWord(body, 0);
  if (len > (1u << 20)) return Status::Error(Code::kCorruption, "CRIU image `{}`: a {}-byte ghost entry", path, len);
  std::string entry(len, '\0');
  n = ::pread(fd.get(), entry.data(), len, static_cast<off_t>(head.size()));
  if (n != static_cast<ssize_t>(len))
    return n < 0 ? Status::Errno(errno, "reading `{}`", path)
                 : Status::Error(Code::kCorruption, "CRIU image `{}` ends inside its ghost entry", path);
  auto parsed = ParseImageMessage(entry);
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
    GPUSNAP_ASSIGN_OR_RETURN(ImageMessage ghost_entry,
                             GhostEntry(fmt::format("{}/ghost-file-{:x}.img", images_dir, id)));
    auto mode = ghost_entry.Varint(kGhostMode);
    out.push_back({.id = id, .path = named->second, .directory = mode && S_ISDIR(static_cast<mode_t>(*mode))});
  }
  return out;
}

}  // namespace gpusnap::criu
