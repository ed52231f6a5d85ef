#include "util/byte_size.h"

#include <cctype>
#include <limits>

namespace gpusnap {

namespace {

// The power of 1024 a suffix letter stands for; -1 for none of them.
int Exponent(char c) {
  switch (std::tolower(static_cast<unsigned char>(c))) {
    case 'k': return 1;
    case 'm': return 2;
    case 'g': return 3;
    case 't': return 4;
    case 'p': return 5;
    default: return -1;
  }
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

Result<uint64_t> ParseByteSize(std::string_view text) {
  auto malformed = [&] {
    return Status::Error(Code::kInvalidArgument,
                         "`{}` is not a size (bytes, or a number with K, M, G, T or P: 512M, 20G, 1.5T)", text);
  };
  size_t i = 0;
  uint64_t whole = 0;
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  for (; i < text.size() && IsDigit(text[i]); ++i) {
    uint64_t d = static_cast<uint64_t>(text[i] - '0');
    if (whole > (kMax - d) / 10) return Status::Error(Code::kInvalidArgument, "size `{}` is too large", text);
    whole = whole * 10 + d;
  }
  if (i == 0) return malformed();
  // The fraction, kept as digits over a power of ten (the first 9 count).
  uint64_t frac = 0, frac_scale = 1;
  if (i < text.size() && text[i] == '.') {
    size_t start = ++i;
    for (; i < text.size() && IsDigit(text[i]); ++i)
      if (frac_scale < 1'000'000'000) {
        frac = frac * 10 + static_cast<uint64_t>(text[i] - '0');
        frac_scale *= 10;
      }
    if (i == start) return malformed();
  }
  int exponent = 0;
  if (i < text.size() && Exponent(text[i]) >= 0) {
    exponent = Exponent(text[i++]);
    if (i < text.size() && (text[i] == 'i' || text[i] == 'I')) {
      if (++i == text.size() || (text[i] != 'B' && text[i] != 'b')) return malformed();
    }
  }
  if (i < text.size() && (text[i] == 'B' || text[i] == 'b')) ++i;
  if (i != text.size()) return malformed();
  if (frac_scale > 1 && exponent == 0) return malformed();  // a fraction of a byte

  uint64_t unit = 1;
  for (int e = 0; e < exponent; ++e) unit *= 1024;
  if (whole > kMax / unit) return Status::Error(Code::kInvalidArgument, "size `{}` is too large", text);
  uint64_t bytes = whole * unit;
  // frac / frac_scale of a unit, rounded down, one factor of 1024 at a time
  // (the remainder stays below frac_scale <= 10^9, so nothing overflows).
  uint64_t part = 0, rest = frac;
  for (int e = 0; e < exponent; ++e) {
    rest *= 1024;
    part = part * 1024 + rest / frac_scale;
    rest %= frac_scale;
  }
  if (bytes > kMax - part) return Status::Error(Code::kInvalidArgument, "size `{}` is too large", text);
  return bytes + part;
}

}  // namespace gpusnap
