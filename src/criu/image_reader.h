// CRIU's image files read by field number, without CRIU's .proto files (the
// bundle ships only rpc.proto): an image is two magic words (the common or
// service one, then the image's own), then entries of a 32-bit length in the
// writing host's order and a protobuf message. Only the fields a reader
// names by number are looked at; the numbers come from CRIU's images/*.proto
// and are spelled beside each reader (ghost_files.cc, task_credentials.cc).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpusnap/status.h"

namespace gpusnap::criu {

// criu/include/magic.h: the word every image starts with, then its own.
inline constexpr uint32_t kCommonMagic = 0x54564319;
inline constexpr uint32_t kServiceMagic = 0x55105940;

// A message's fields by number, every occurrence in wire order.
struct ImageMessage {
  std::map<int, std::vector<uint64_t>> varints;
  std::map<int, std::vector<std::string>> bytes;  // strings, bytes, nested messages, packed arrays

  std::optional<uint64_t> Varint(int number) const;      // the first
  std::optional<std::string> Bytes(int number) const;    // the first
  const std::vector<std::string>& AllBytes(int number) const;
  // A repeated scalar: each varint, and each packed array decoded (a writer
  // may send either form). nullopt when a packed array is malformed.
  std::optional<std::vector<uint64_t>> Varints(int number) const;
};

// The 32-bit word at byte `at` of `bytes` (REQUIRES: 4 bytes there), in the
// order of the host that wrote it, as CRIU reads it.
uint32_t ImageWord(std::string_view bytes, size_t at);

// A message's wire form parsed; nullopt when it is not a protobuf message.
std::optional<ImageMessage> ParseImageMessage(std::string_view wire);

// The bytes after an image's magic words; kCorruption naming `path` when
// they are not CRIU's `magic`.
Result<std::string_view> ImageBody(std::string_view image, uint32_t magic, const std::string& path);

// Every entry of the image at `path`. kCorruption naming it (and the byte)
// when it is not an image of `magic` as CRIU writes one; kIoError when it
// cannot be read.
Result<std::vector<ImageMessage>> ReadImage(const std::string& path, uint32_t magic);

}  // namespace gpusnap::criu
