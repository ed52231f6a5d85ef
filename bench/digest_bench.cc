// Side by side: whole-file SHA-256 on one thread (snapshot schema < 1.2)
// against SHA-256 over 64 MiB chunks on every core (schema 1.2), on the same
// file, from the page cache.  usage: gpusnap_digest_bench FILE [ROUNDS]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "store/digest.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE [ROUNDS]\n", argv[0]);
    return 2;
  }
  std::filesystem::path file = std::filesystem::absolute(argv[1]);
  int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  auto time = [&](unsigned threads, uint64_t chunk) {
    double best = 1e9;
    for (int i = 0; i < rounds; ++i) {
      auto t = std::chrono::steady_clock::now();
      auto d = gpusnap::DigestFiles(file.parent_path(), {file.filename()}, false, threads, chunk);
      if (!d.ok()) {
        std::fprintf(stderr, "%s\n", d.status().message().c_str());
        std::exit(1);
      }
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count());
    }
    return best;
  };
  double gib = static_cast<double>(std::filesystem::file_size(file)) / (1 << 30);
  double whole = time(1, *gpusnap::DigestChunkBytes("sha256"));
  double chunked = time(0, gpusnap::kDigestChunkBytes);
  std::printf("file %.2f GiB, best of %d\n", gib, rounds);
  std::printf("sha256 whole file, 1 thread     %.3f s  %.2f GiB/s  1.00\n", whole, gib / whole);
  std::printf("sha256 64 MiB chunks, all cores %.3f s  %.2f GiB/s  %.2fx\n", chunked, gib / chunked, whole / chunked);
}
