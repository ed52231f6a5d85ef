#include "store/digest.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "store/snapshot_tree.h"
#include "util/fd.h"
#include "util/first_failure.h"

namespace gpusnap {

namespace {

using Sha = std::array<unsigned char, 32>;

std::string Hex(const Sha& d) { return HexOf(d.data(), d.size()); }

struct File {
  std::string name;
  UniqueFd fd;
  uint64_t size = 0;
  std::vector<Sha> chunks;
};

struct Task {
  size_t file;
  size_t chunk;
};

// Waits, while the reader runs, for the page cache to hold a block.
void AwaitReader(const DigestPace& pace, int fd, uint64_t off, uint64_t n) {
  if (!pace.reader_done) return;
  while (!pace.reader_done() && !PageCacheHolds(fd, off, n)) std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

}  // namespace

bool PageCacheHolds(int fd, uint64_t offset, uint64_t length) {
  if (length == 0) return true;
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  uint64_t start = offset / page * page;
  size_t span = static_cast<size_t>(offset + length - start);
  void* map = ::mmap(nullptr, span, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(start));
  if (map == MAP_FAILED) return false;
  std::vector<unsigned char> resident((span + page - 1) / page);
  bool all = ::mincore(map, span, resident.data()) == 0 &&
             std::all_of(resident.begin(), resident.end(), [](unsigned char r) { return (r & 1) != 0; });
  ::munmap(map, span);
  return all;
}

Result<std::map<std::string, FileDigest>> DigestFiles(const std::string& root, const std::vector<std::string>& names,
                                                      bool sync, unsigned threads, uint64_t chunk_bytes,
                                                      const DigestPace& pace) {
  std::vector<File> files(names.size());
  std::vector<Task> tasks;
  for (size_t i = 0; i < names.size(); ++i) {
    File& f = files[i];
    f.name = names[i];
    std::string path = root + "/" + names[i];
    // No link is followed, and nothing but a regular file is read: a FIFO
    // put in place of an image must not block us (O_NONBLOCK), nor a link
    // lead the digest to a file outside the snapshot.
    f.fd.Reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
    if (!f.fd.valid() && errno == ELOOP)
      return Status::Error(Code::kCorruption, "`{}` is a symbolic link, not a regular file", path);
    struct stat st{};
    if (!f.fd.valid() || ::fstat(f.fd.get(), &st) != 0) return Status::Errno(errno, "opening `{}`", path);
    if (!S_ISREG(st.st_mode))
      return Status::Error(Code::kCorruption, "`{}` is {}, not a regular file", path, DescribeFileType(st.st_mode));
    f.size = static_cast<uint64_t>(st.st_size);
    size_t n = std::max<uint64_t>(1, (f.size + chunk_bytes - 1) / chunk_bytes);
    f.chunks.resize(n);
    for (size_t c = 0; c < n; ++c) tasks.push_back({i, c});
  }
  // Largest files first keeps the tail short.
  std::stable_sort(tasks.begin(), tasks.end(),
                   [&](const Task& a, const Task& b) { return files[a.file].size > files[b.file].size; });

  std::atomic<size_t> next{0};
  FirstFailure failure;
  auto work = [&] {
    std::vector<char> buf(4 << 20);
    for (size_t t; (t = next.fetch_add(1)) < tasks.size();) {
      File& f = files[tasks[t].file];
      uint64_t off = tasks[t].chunk * chunk_bytes, end = std::min(f.size, off + chunk_bytes);
      Status st;
      if (sync && tasks[t].chunk == 0 && ::fsync(f.fd.get()) != 0) st = Status::Errno(errno, "syncing `{}`", f.name);
      Sha256 h;
      while (st.ok() && off < end) {
        uint64_t want = std::min<uint64_t>(buf.size(), end - off);
        AwaitReader(pace, f.fd.get(), off, want);
        ssize_t r = ::pread(f.fd.get(), buf.data(), want, static_cast<off_t>(off));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
          st = r < 0 ? Status::Errno(errno, "reading `{}`", f.name)
                     : Status::Error(Code::kCorruption, "`{}` shrank while being read", f.name);
          break;
        }
        h.Update(buf.data(), static_cast<size_t>(r));
        off += static_cast<uint64_t>(r);
      }
      if (!st.ok()) {
        failure.Record(st);
        return;
      }
      f.chunks[tasks[t].chunk] = h.Final();
    }
  };
  unsigned cores = std::thread::hardware_concurrency();
  unsigned n = threads ? threads : (cores > pace.spare_cores ? cores - pace.spare_cores : 1u);
  n = static_cast<unsigned>(std::min<size_t>(n, std::max<size_t>(1, tasks.size())));
  std::vector<std::thread> pool;
  for (unsigned i = 1; i < n; ++i) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  GPUSNAP_RETURN_IF_ERROR(failure.Get());

  std::map<std::string, FileDigest> out;
  for (auto& f : files) {
    FileDigest d;
    d.size = f.size;
    if (f.chunks.size() == 1) {
      d.sha256 = Hex(f.chunks[0]);
    } else {
      Sha256 top;
      for (const auto& c : f.chunks) top.Update(c.data(), c.size());
      d.sha256 = Hex(top.Final());
    }
    out[f.name] = d;
  }
  return out;
}

Result<uint64_t> DigestChunkBytes(std::string_view algorithm) {
  if (algorithm == kDigestAlgorithm) return kDigestChunkBytes;
  if (algorithm == "sha256") return UINT64_MAX / 2;
  return Status::Error(Code::kNotSupported, "unknown digest algorithm `{}`", algorithm);
}

}  // namespace gpusnap
