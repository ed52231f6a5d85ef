#include "chunks/chunk_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>

#include "util/files.h"
#include "util/temp_dir_testing.h"

namespace gpusnap::chunks {
namespace {

class ChunkStoreTest : public ::testing::Test {
 protected:
  TempDir tmp_{"chunk-store-test"};
  void SetUp() override {
    root_ = tmp_.path();
    auto store = ChunkStore::Open(root_);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_.emplace(std::move(store).value());
  }

  // `size` random bytes from a fixed seed (distinct seeds, distinct chunks).
  static std::vector<char> Random(uint64_t size, uint32_t seed) {
    std::vector<char> v(size);
    std::mt19937_64 rng(seed);
    for (uint64_t i = 0; i + 8 <= size; i += 8) {
      uint64_t x = rng();
      std::memcpy(v.data() + i, &x, 8);
    }
    for (uint64_t i = size / 8 * 8; i < size; ++i) v[i] = static_cast<char>(rng());
    return v;
  }

  size_t ChunkFiles() const {
    size_t n = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(root_ + "/chunks"))
      if (e.is_regular_file()) ++n;
    return n;
  }

  std::vector<char> LoadAll(const ChunkedAllocation& a, unsigned threads, Status* st) {
    std::vector<char> out(a.size, 'x');
    *st = store_->Load(a, out.data(), out.size(), threads);
    return out;
  }

  void FlipBit(const std::string& path, uint64_t offset) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(offset));
    char c = 0;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(static_cast<std::streamoff>(offset));
    f.write(&c, 1);
  }

  // Loading `a` fails with `code` and a message naming `path`.
  void ExpectLoadFails(const ChunkedAllocation& a, unsigned threads, Code code, const std::string& path) {
    Status st;
    (void)LoadAll(a, threads, &st);
    EXPECT_EQ(st.code(), code) << st.ToString();
    EXPECT_NE(st.message().find(path), std::string::npos) << st.message();
  }

  std::string root_;
  std::optional<ChunkStore> store_;
};

TEST_F(ChunkStoreTest, RoundTripOfManySizes) {
  const uint64_t sizes[] = {0, 1, kChunkBytes - 1, kChunkBytes, kChunkBytes + 1, 150ull << 20};
  uint32_t seed = 1;
  for (uint64_t size : sizes) {
    SCOPED_TRACE(size);
    std::vector<char> data = Random(size, seed++);
    SaveStats stats;
    auto a = store_->Save(data.data(), data.size(), 0x7f0000000000 + size, 1, &stats);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_EQ(a->size, size);
    EXPECT_EQ(a->device, 1);
    EXPECT_EQ(a->chunks.size(), (size + kChunkBytes - 1) / kChunkBytes);
    EXPECT_EQ(stats.chunks_written, a->chunks.size());
    EXPECT_EQ(stats.bytes_written, size);
    for (const ChunkRef& c : a->chunks) {
      struct stat st{};
      ASSERT_EQ(::stat(store_->ChunkPath(c.digest).c_str(), &st), 0);
      EXPECT_EQ(static_cast<uint64_t>(st.st_size), c.length);
    }
    Status st;
    std::vector<char> back = LoadAll(*a, 2, &st);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_TRUE(back == data);
  }
}

TEST_F(ChunkStoreTest, UnalignedSourceBuffer) {
  std::vector<char> data = Random(kChunkBytes + 4097, 7);
  auto a = store_->Save(data.data() + 1, data.size() - 1, 0x1000, 0);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  Status st;
  std::vector<char> back = LoadAll(*a, 1, &st);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(0, std::memcmp(back.data(), data.data() + 1, back.size()));
}

TEST_F(ChunkStoreTest, ChunkPathIsPrefixDirAndHex) {
  std::vector<char> data = Random(100, 3);
  auto a = store_->Save(data.data(), data.size(), 0, 0);
  ASSERT_TRUE(a.ok());
  std::string hex = DigestHex(a->chunks[0].digest);
  ASSERT_EQ(hex.size(), 32u);
  EXPECT_EQ(store_->ChunkPath(a->chunks[0].digest), root_ + "/chunks/" + hex.substr(0, 2) + "/" + hex);
  EXPECT_EQ(ChunkFiles(), 1u);  // no temporary left behind
}

TEST_F(ChunkStoreTest, ZeroChunksAreNotStored) {
  // zero, data, zero, short zero tail
  std::vector<char> data(3 * kChunkBytes + 10, 0);
  data[kChunkBytes + 12345] = 1;
  SaveStats stats;
  auto a = store_->Save(data.data(), data.size(), 0x2000, 0, &stats);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_EQ(a->chunks.size(), 4u);
  EXPECT_TRUE(a->chunks[0].zero);
  EXPECT_FALSE(a->chunks[1].zero);
  EXPECT_TRUE(a->chunks[2].zero);
  EXPECT_TRUE(a->chunks[3].zero);
  EXPECT_EQ(a->chunks[3].length, 10u);
  EXPECT_EQ(stats.chunks_zero, 3u);
  EXPECT_EQ(ChunkFiles(), 1u);
  Status st;
  std::vector<char> back = LoadAll(*a, 3, &st);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(back == data);
}

TEST_F(ChunkStoreTest, IdenticalChunksAreStoredOnce) {
  std::vector<char> one = Random(kChunkBytes, 11);
  std::vector<char> data(one);
  data.insert(data.end(), one.begin(), one.end());
  SaveStats stats;
  auto a = store_->Save(data.data(), data.size(), 0x3000, 0, &stats);
  ASSERT_TRUE(a.ok());
  auto b = store_->Save(one.data(), one.size(), 0x4000, 1, &stats);  // another allocation, same weights
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->chunks[0].digest, a->chunks[1].digest);
  EXPECT_EQ(a->chunks[0].digest, b->chunks[0].digest);
  EXPECT_EQ(stats.chunks_written, 1u);
  EXPECT_EQ(stats.chunks_present, 2u);
  EXPECT_EQ(ChunkFiles(), 1u);
}

TEST_F(ChunkStoreTest, FlippedBitIsDetected) {
  std::vector<char> data = Random(kChunkBytes + 100, 21);
  auto a = store_->Save(data.data(), data.size(), 0x5000, 0);
  ASSERT_TRUE(a.ok());
  std::string path = store_->ChunkPath(a->chunks[1].digest);
  FlipBit(path, 50);
  ExpectLoadFails(*a, 2, Code::kCorruption, path);
}

TEST_F(ChunkStoreTest, TruncatedChunkIsRejected) {
  std::vector<char> data = Random(5000, 22);
  auto a = store_->Save(data.data(), data.size(), 0x6000, 0);
  ASSERT_TRUE(a.ok());
  std::string path = store_->ChunkPath(a->chunks[0].digest);
  ASSERT_EQ(::truncate(path.c_str(), 4999), 0);
  ExpectLoadFails(*a, 1, Code::kCorruption, path);
}

TEST_F(ChunkStoreTest, MissingChunkIsNamed) {
  std::vector<char> data = Random(2 * kChunkBytes, 23);
  auto a = store_->Save(data.data(), data.size(), 0x7000, 0);
  ASSERT_TRUE(a.ok());
  std::string path = store_->ChunkPath(a->chunks[0].digest);
  ASSERT_EQ(::unlink(path.c_str()), 0);
  ExpectLoadFails(*a, 2, Code::kNotFound, path);
}

TEST_F(ChunkStoreTest, LoadRejectsWrongBufferSize) {
  std::vector<char> data = Random(100, 24);
  auto a = store_->Save(data.data(), data.size(), 0x8000, 0);
  ASSERT_TRUE(a.ok());
  std::vector<char> small(99);
  EXPECT_EQ(store_->Load(*a, small.data(), small.size()).code(), Code::kInvalidArgument);
}

TEST_F(ChunkStoreTest, ParallelLoadEqualsSerialLoad) {
  std::vector<char> data = Random(5 * kChunkBytes + 777, 31);
  std::memset(data.data() + 2 * kChunkBytes, 0, kChunkBytes);  // one zero chunk among them
  auto a = store_->Save(data.data(), data.size(), 0x9000, 0);
  ASSERT_TRUE(a.ok());
  Status serial_st, parallel_st;
  std::vector<char> serial = LoadAll(*a, 1, &serial_st);
  std::vector<char> parallel = LoadAll(*a, 4, &parallel_st);
  ASSERT_TRUE(serial_st.ok()) << serial_st.ToString();
  ASSERT_TRUE(parallel_st.ok()) << parallel_st.ToString();
  EXPECT_TRUE(serial == parallel);
  EXPECT_TRUE(serial == data);
}

// Direct I/O asked for: a chunk of `data` saved under a fresh directory made
// from `dir_template` loads back the same.
void RoundTripWithDirectIo(std::string dir_template, const std::vector<char>& data) {
  if (::mkdtemp(dir_template.data()) == nullptr) GTEST_SKIP() << "cannot create " << dir_template;
  std::string root = dir_template;
  auto store = ChunkStore::Open(root, ChunkStore::DirectIo::kOn);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto a = store->Save(data.data(), data.size(), 0x1000, 0);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  std::vector<char> back(data.size());
  Status st = store->Load(*a, back.data(), back.size(), 2);
  (void)RemoveTree(root);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(back == data);
}

// tmpfs refuses O_DIRECT on older kernels: the store falls back to buffered writes there.
TEST(ChunkStoreOtherFs, RoundTripOnTmpfs) {
  RoundTripWithDirectIo("/dev/shm/gpusnap-chunk-store-test-XXXXXX", std::vector<char>(kChunkBytes + 3, 'a'));
}

// On a disk that takes O_DIRECT, with lengths that are not multiples of a block.
TEST(ChunkStoreOtherFs, RoundTripWithDirectIo) {
  std::vector<char> data(kChunkBytes + 4097);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  RoundTripWithDirectIo("/var/tmp/gpusnap-chunk-store-direct-XXXXXX", data);
}

TEST_F(ChunkStoreTest, ReaderReadsInPiecesAndChecksTheDigestAtTheEnd) {
  std::vector<char> data(kChunkBytes);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 13 + 1);
  auto a = store_->Save(data.data(), data.size(), 0x1000, 0);
  ASSERT_TRUE(a.ok());
  const ChunkRef& ref = a->chunks[0];
  auto reader = ChunkReader::Open(*store_, ref);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::vector<char> back(data.size());
  uint64_t piece = 5 << 20;  // not a divisor of the chunk
  for (uint64_t off = 0; reader->remaining() > 0; off += piece) {
    uint64_t n = std::min(piece, reader->remaining());
    ASSERT_TRUE(reader->Read(back.data() + off, n).ok());
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_TRUE(back == data);
  EXPECT_FALSE(reader->Read(back.data(), 1).ok());  // nothing left

  // Unfinished, and a flipped bit: both refused at Finish.
  auto early = ChunkReader::Open(*store_, ref);
  ASSERT_TRUE(early->Read(back.data(), 10).ok());
  EXPECT_NE(early->Finish().message().find("unread"), std::string::npos);
  std::string path = store_->ChunkPath(ref.digest);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(777);
    f.put(static_cast<char>(data[777] ^ 4));
  }
  auto flipped = ChunkReader::Open(*store_, ref);
  ASSERT_TRUE(flipped.ok());
  ASSERT_TRUE(flipped->Read(back.data(), ref.length).ok());
  Status st = flipped->Finish();
  EXPECT_EQ(st.code(), Code::kCorruption);
  EXPECT_NE(st.message().find("does not match its digest"), std::string::npos);
  ::unlink(path.c_str());
  auto missing = ChunkReader::Open(*store_, ref);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(path), std::string::npos);
}

// --- the mark of a use (the chunk's mtime) -----------------------------------

// Sets `path`'s mtime to an hour ago and returns it (ns since the epoch).
int64_t AgeAnHour(const std::string& path) {
  struct timespec times[2] = {{0, UTIME_OMIT}, {::time(nullptr) - 3600, 0}};
  EXPECT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
  return static_cast<int64_t>(times[1].tv_sec) * 1'000'000'000;
}

int64_t MtimeNs(const std::string& path) {
  struct stat st{};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

// Within a minute of now: marked by what ran just before.
bool Recent(int64_t mtime_ns) { return mtime_ns / 1'000'000'000 > static_cast<int64_t>(::time(nullptr)) - 60; }

TEST_F(ChunkStoreTest, ALoadMarksEveryChunkItReads) {
  auto data = Random(kChunkBytes + 4096, 7);
  auto a = store_->Save(data.data(), data.size(), 0x1000, 0);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_EQ(a->chunks.size(), 2u);
  std::vector<std::string> paths;
  for (const ChunkRef& c : a->chunks) paths.push_back(store_->ChunkPath(c.digest));
  for (const auto& p : paths) EXPECT_FALSE(Recent(AgeAnHour(p)));
  Status st;
  EXPECT_EQ(LoadAll(*a, 2, &st), data);
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (const auto& p : paths) EXPECT_TRUE(Recent(MtimeNs(p))) << p;
}

TEST_F(ChunkStoreTest, OpeningAReaderMarksTheChunk) {
  auto data = Random(5000, 8);
  auto ref = store_->SaveChunk(data.data(), data.size());
  ASSERT_TRUE(ref.ok());
  std::string path = store_->ChunkPath(ref->digest);
  AgeAnHour(path);
  auto reader = ChunkReader::Open(*store_, *ref);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_TRUE(Recent(MtimeNs(path)));
}

TEST_F(ChunkStoreTest, ASaveThatFindsTheChunkStoredMarksIt) {
  auto data = Random(5000, 9);
  auto first = store_->SaveChunk(data.data(), data.size());
  ASSERT_TRUE(first.ok());
  std::string path = store_->ChunkPath(first->digest);
  AgeAnHour(path);
  SaveStats stats;
  ASSERT_TRUE(store_->SaveChunk(data.data(), data.size(), &stats).ok());
  EXPECT_EQ(stats.chunks_present, 1u);
  EXPECT_TRUE(Recent(MtimeNs(path)));
}

TEST_F(ChunkStoreTest, MarkUsedMarksAStoredChunkAndMakesNoMissingOne) {
  auto data = Random(5000, 10);
  auto ref = store_->SaveChunk(data.data(), data.size());
  ASSERT_TRUE(ref.ok());
  std::string path = store_->ChunkPath(ref->digest);
  int64_t aged = AgeAnHour(path);
  store_->MarkUsed(ref->digest);
  EXPECT_GT(MtimeNs(path), aged);
  EXPECT_TRUE(Recent(MtimeNs(path)));
  ChunkDigest absent{};
  absent.fill(0xab);
  store_->MarkUsed(absent);
  EXPECT_NE(::access(store_->ChunkPath(absent).c_str(), F_OK), 0);
}

TEST(ChunkStoreHelpers, IsAllZero) {
  std::vector<char> v(200000, 0);
  EXPECT_TRUE(IsAllZero(v.data(), v.size()));
  EXPECT_TRUE(IsAllZero(v.data(), 0));
  v[199999] = 1;
  EXPECT_FALSE(IsAllZero(v.data(), v.size()));
  EXPECT_TRUE(IsAllZero(v.data(), 199999));
}

TEST(ChunkStoreHelpers, DigestOfKnownInput) {
  // XXH3-128 of the empty input, as xxhsum -H2 prints it.
  EXPECT_EQ(DigestHex(ComputeChunkDigest("", 0)), "99aa06d3014798d86001c324468d497f");
}

TEST(ChunkDigestHexTest, ParsesWhatDigestHexPrintsAndNothingElse) {
  ChunkDigest d = ComputeChunkDigest("chunk", 5);
  EXPECT_EQ(ParseDigestHex(DigestHex(d)), d);
  EXPECT_FALSE(ParseDigestHex("").has_value());
  EXPECT_FALSE(ParseDigestHex(std::string(31, 'a')).has_value());
  EXPECT_FALSE(ParseDigestHex(std::string(32, 'A')).has_value());
  EXPECT_FALSE(ParseDigestHex(std::string(31, 'a') + "g").has_value());
}

}  // namespace
}  // namespace gpusnap::chunks
