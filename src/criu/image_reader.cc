#include "criu/image_reader.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/unknown_field_set.h>

#include <cstring>

#include "util/files.h"

namespace gpusnap::criu {

namespace {

using google::protobuf::UnknownField;
using google::protobuf::UnknownFieldSet;

// The entries of an image body, which starts at byte `base` of the file: each
// a length and a message.
Result<std::vector<ImageMessage>> Entries(std::string_view body, size_t base, const std::string& path) {
  std::vector<ImageMessage> out;
  size_t at = 0;
  while (at < body.size()) {
    if (body.size() - at < 4)
      return Status::Error(Code::kCorruption, "CRIU image `{}` ends inside an entry's length (at byte {})", path,
                           base + at);
    uint32_t len = ImageWord(body, at);
    at += 4;
    if (body.size() - at < len)
      return Status::Error(Code::kCorruption, "CRIU image `{}`: an entry of {} bytes at byte {} runs past its end",
                           path, len, base + at);
    auto entry = ParseImageMessage(body.substr(at, len));
    if (!entry)
      return Status::Error(Code::kCorruption, "CRIU image `{}`: the entry at byte {} is not a protobuf message", path,
                           base + at);
    out.push_back(std::move(*entry));
    at += len;
  }
  return out;
}

}  // namespace

uint32_t ImageWord(std::string_view bytes, size_t at) {
  uint32_t v;
  std::memcpy(&v, bytes.data() + at, sizeof v);
  return v;
}

std::optional<uint64_t> ImageMessage::Varint(int number) const {
  auto it = varints.find(number);
  return it == varints.end() ? std::nullopt : std::optional<uint64_t>(it->second.front());
}

std::optional<std::string> ImageMessage::Bytes(int number) const {
  auto it = bytes.find(number);
  return it == bytes.end() ? std::nullopt : std::optional<std::string>(it->second.front());
}

const std::vector<std::string>& ImageMessage::AllBytes(int number) const {
  static const std::vector<std::string> kNone;
  auto it = bytes.find(number);
  return it == bytes.end() ? kNone : it->second;
}

std::optional<std::vector<uint64_t>> ImageMessage::Varints(int number) const {
  std::vector<uint64_t> out;
  if (auto it = varints.find(number); it != varints.end()) out = it->second;
  for (const std::string& packed : AllBytes(number)) {
    google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(packed.data()),
                                              static_cast<int>(packed.size()));
    while (in.BytesUntilLimit() > 0) {
      uint64_t v = 0;
      if (!in.ReadVarint64(&v)) return std::nullopt;
      out.push_back(v);
    }
  }
  return out;
}

std::optional<ImageMessage> ParseImageMessage(std::string_view wire) {
  UnknownFieldSet set;
  if (!set.ParseFromArray(wire.data(), static_cast<int>(wire.size()))) return std::nullopt;
  ImageMessage m;
  for (int i = 0; i < set.field_count(); ++i) {
    const UnknownField& f = set.field(i);
    if (f.type() == UnknownField::TYPE_VARINT) m.varints[f.number()].push_back(f.varint());
    if (f.type() == UnknownField::TYPE_LENGTH_DELIMITED) m.bytes[f.number()].push_back(f.length_delimited());
  }
  return m;
}

Result<std::string_view> ImageBody(std::string_view image, uint32_t magic, const std::string& path) {
  if (image.size() < 4) return Status::Error(Code::kCorruption, "CRIU image `{}` is too short for its magic", path);
  size_t at = 4;
  uint32_t first = ImageWord(image, 0);
  if (first == kCommonMagic || first == kServiceMagic) {
    if (image.size() < 8) return Status::Error(Code::kCorruption, "CRIU image `{}` is too short for its magic", path);
    first = ImageWord(image, 4);
    at = 8;
  }
  if (first != magic)
    return Status::Error(Code::kCorruption, "CRIU image `{}` has magic {:#x}, not {:#x}", path, first, magic);
  return image.substr(at);
}

Result<std::vector<ImageMessage>> ReadImage(const std::string& path, uint32_t magic) {
  GPUSNAP_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  GPUSNAP_ASSIGN_OR_RETURN(std::string_view body, ImageBody(text, magic, path));
  return Entries(body, text.size() - body.size(), path);
}

}  // namespace gpusnap::criu
