// SHA-256 of a stream of bytes (OpenSSL): the snapshot's file digests
// (digest.h) are built from it, and the OCI registry names blobs by it.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "gpusnap/status.h"

struct evp_md_ctx_st;

namespace gpusnap {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;
  void Update(const void* data, size_t n);
  void Update(std::string_view bytes) { Update(bytes.data(), bytes.size()); }
  // The digest; the object is spent.
  std::array<unsigned char, 32> Final();
  std::string HexFinal();  // 64 lower-case hex digits

 private:
  std::unique_ptr<evp_md_ctx_st, void (*)(evp_md_ctx_st*)> ctx_;
};

// Pure. Lower-case hex of `n` bytes at `bytes`.
std::string HexOf(const unsigned char* bytes, size_t n);

// Pure. SHA-256 (lower-case hex) of `bytes`.
std::string Sha256Hex(std::string_view bytes);

// SHA-256 (lower-case hex) of the file at `path` (not following a link).
Result<std::string> Sha256OfFile(const std::string& path);

}  // namespace gpusnap
