#include "store/sha256.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <vector>

#include "util/fd.h"

namespace gpusnap {

Sha256::Sha256() : ctx_(EVP_MD_CTX_new(), EVP_MD_CTX_free) { EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr); }
Sha256::~Sha256() = default;
Sha256::Sha256(Sha256&&) noexcept = default;
Sha256& Sha256::operator=(Sha256&&) noexcept = default;

void Sha256::Update(const void* data, size_t n) { EVP_DigestUpdate(ctx_.get(), data, n); }

std::array<unsigned char, 32> Sha256::Final() {
  std::array<unsigned char, 32> out{};
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx_.get(), out.data(), &len);
  return out;
}

std::string Sha256::HexFinal() {
  auto d = Final();
  return HexOf(d.data(), d.size());
}

std::string HexOf(const unsigned char* bytes, size_t n) {
  static const char* kHex = "0123456789abcdef";
  std::string s;
  s.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    s.push_back(kHex[bytes[i] >> 4]);
    s.push_back(kHex[bytes[i] & 15]);
  }
  return s;
}

std::string Sha256Hex(std::string_view bytes) {
  Sha256 h;
  h.Update(bytes);
  return h.HexFinal();
}

Result<std::string> Sha256OfFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return Status::Errno(errno, "opening `{}`", path);
  ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  Sha256 h;
  std::vector<char> buf(4 << 20);
  for (;;) {
    ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::Errno(errno, "reading `{}`", path);
    if (n == 0) break;
    h.Update(buf.data(), static_cast<size_t>(n));
  }
  return h.HexFinal();
}

}  // namespace gpusnap
