// Side by side: a 64 MiB chunk's bytes as a pull in the clear takes them
// (each 4 KiB piece the network delivers copied into the chunk's buffer and
// hashed, SHA-256) against a sealed pull's (each piece MACed and copied, the
// keystream applied behind on a thread of the chunk's own:
// registry::ChunkDecryption, what the pull runs), from a piece still in cache
// as a socket's would be. The times are the receiving thread's wall time to
// a chunk ready to be named and stored.  usage: gpusnap_chunk_decrypt_bench [ROUNDS]
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "registry/encryption.h"
#include "store/sha256.h"

namespace {

constexpr size_t kChunk = size_t(64) << 20;
constexpr size_t kPiece = 4096;  // what cpp-httplib hands a content receiver at a time

template <typename Take>
double SecondsPerChunk(const std::string& arriving, int rounds, Take take) {
  double best = 1e9;
  std::string buf(kChunk, '\0');
  static std::array<char, kPiece> socket;
  for (int i = 0; i < rounds; ++i) {
    auto t = std::chrono::steady_clock::now();
    take(buf, [&](auto piece_into) {
      for (size_t at = 0; at < kChunk; at += kPiece) {
        std::memcpy(socket.data(), arriving.data() + at, kPiece);  // the kernel's copy out of the socket
        piece_into(socket.data(), kPiece);
      }
    });
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gpusnap;
  int rounds = argc > 1 ? std::atoi(argv[1]) : 5;
  std::string arriving(kChunk, '\0');
  for (size_t i = 0; i < kChunk; ++i) arriving[i] = char(i * 2654435761u >> 13);
  std::array<unsigned char, registry::kTenantSecretBytes> secret{};
  std::string plain_digest = "sha256:" + std::string(64, '0');
  registry::OpenedBlob opened{{registry::DeriveLayerKey(secret, plain_digest), plain_digest}, std::string(32, '\0')};

  double clear = SecondsPerChunk(arriving, rounds, [](std::string& buf, auto stream) {
    Sha256 hash;
    size_t have = 0;
    stream([&](const char* data, size_t n) {
      std::memcpy(buf.data() + have, data, n);
      hash.Update(data, n);
      have += n;
    });
    (void)hash.HexFinal();
  });
  double sealed = SecondsPerChunk(arriving, rounds, [&](std::string& buf, auto stream) {
    registry::ChunkDecryption decryption(opened, buf.data());
    stream([&](const char* data, size_t n) { decryption.Take(data, n); });
    (void)decryption.Finish("bench", "chunk");  // the MAC is not the chunk's: only its cost counts
  });
  auto ns = [](double s) { return s * 1e9 / double(kChunk); };
  std::printf("64 MiB chunk in 4 KiB pieces, best of %d\n", rounds);
  std::printf("clear  (copy + SHA-256)              %.3f ns/byte  %.2f GB/s  1.00\n", ns(clear), kChunk / clear / 1e9);
  std::printf("sealed (MAC + copy, AES-CTR behind)  %.3f ns/byte  %.2f GB/s  %.2fx\n", ns(sealed),
              kChunk / sealed / 1e9, sealed / clear);
}
