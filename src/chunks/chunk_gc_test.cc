#include "chunks/chunk_gc.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <optional>

#include "chunks/chunk_store.h"
#include "util/files.h"
#include "store/meta_testing.h"

namespace gpusnap::chunks {
namespace {

std::string Hex(char c) { return std::string(32, c); }

ChunkRef Stored(uint8_t fill, uint64_t length = kChunkBytes) {
  ChunkRef r;
  r.digest.fill(fill);
  r.length = length;
  return r;
}

ChunkRef Zero() {
  ChunkRef r;
  r.zero = true;
  r.length = kChunkBytes;
  return r;
}

ChunkRef Scratch(uint64_t length = kChunkBytes) {
  ChunkRef r = Zero();
  r.scratch = true;
  r.length = length;
  return r;
}

ChunkManifest ManifestOf(std::vector<ChunkRef> refs) {
  ChunkManifest m;
  uint64_t size = 0;
  for (const auto& r : refs) size += r.length;
  m.allocations.push_back({0x7f0000000000, size, 0, std::move(refs)});
  return m;
}

std::vector<std::string> Names(const GcResult& r) {
  std::vector<std::string> out;
  for (const auto& i : r.removed) out.push_back(i.path + " " + i.reason);
  return out;
}

// --- the mark ----------------------------------------------------------------

TEST(LiveChunksTest, StoredChunksOfEveryManifestOnceAndNoZeroChunks) {
  auto live = LiveChunks({ManifestOf({Stored(0x11), Zero(), Stored(0x22, 5)}), ManifestOf({Stored(0x11)}), {}});
  EXPECT_EQ(live, (std::set<std::string>{Hex('1'), Hex('2')}));
}

TEST(LiveChunksTest, ScratchChunksNameNoChunk) {
  auto live = LiveChunks({ManifestOf({Scratch(), Stored(0x33), Scratch(7)})});
  EXPECT_EQ(live, (std::set<std::string>{Hex('3')}));
}

TEST(LiveChunksTest, NoManifestsNothingLive) { EXPECT_TRUE(LiveChunks({}).empty()); }

TEST(SnapshotManifestsTest, WhatTheMetadataListsAndWhatIsThere) {
  SnapshotMeta meta;
  meta.gpu.emplace();
  meta.gpu->gpushare = true;
  meta.gpu->ns_pids = {2, 7};
  EXPECT_EQ(SnapshotManifests(meta, {"2.chunks", "9.chunks", "2.chunks.tmp.41", "notes", ".chunks"}),
            (std::vector<std::string>{"gpu/2.chunks", "gpu/7.chunks", "gpu/9.chunks"}));
}

TEST(SnapshotManifestsTest, APlainGpuSnapshotListsOnlyWhatIsThere) {
  SnapshotMeta meta;
  meta.gpu.emplace();
  meta.gpu->ns_pids = {2};
  EXPECT_TRUE(SnapshotManifests(meta, {}).empty());
  EXPECT_EQ(SnapshotManifests(SnapshotMeta{}, {"5.chunks"}), std::vector<std::string>{"gpu/5.chunks"});
}

// --- the sweep ---------------------------------------------------------------

TEST(DecideSweepTest, UnreferencedChunksGoReferencedStay) {
  std::string a = Hex('a'), b = Hex('b');
  GcResult r = DecideSweep({a}, {{"aa/" + a, 100, 0}, {"bb/" + b, 30, 0}}, 3600, 0);
  EXPECT_EQ(Names(r), std::vector<std::string>{"bb/" + b + " unreferenced"});
  EXPECT_EQ(r.removed_bytes, 30u);
  EXPECT_EQ(r.kept_chunks, 1u);
  EXPECT_EQ(r.kept_bytes, 100u);
}

TEST(DecideSweepTest, TemporariesGoOnlyWhenOld) {
  std::string c = Hex('c');
  GcResult r = DecideSweep({c}, {{"cc/" + c + ".tmp-41-0123456789abcdef", 7, 3601},
                                 {"cc/" + c + ".tmp-42-0123456789abcdef", 9, 3600}},
                           3600, 0);
  EXPECT_EQ(Names(r), std::vector<std::string>{"cc/" + c + ".tmp-41-0123456789abcdef stale temporary"});
  EXPECT_EQ(r.removed_bytes, 7u);
  EXPECT_EQ(r.kept_chunks, 0u);
}

TEST(DecideSweepTest, NamesItDoesNotKnowStay) {
  std::string d = Hex('d');
  GcResult r = DecideSweep({}, {{"ee/" + d, 1, 99999},                   // in the wrong fan-out directory
                                {"dd/" + std::string(32, 'D'), 1, 99999},  // not lowercase
                                {"dd/" + d.substr(1), 1, 99999},           // too short
                                {"dd/" + d + ".bak", 1, 99999},
                                {"dd/README", 1, 99999},
                                {"stray", 1, 99999}},
                           0, 0);
  EXPECT_TRUE(r.removed.empty());
  EXPECT_EQ(r.kept_chunks, 0u);
}

// --- the cache: what goes when unreferenced chunks may stay ------------------

// `n` (name), `bytes`, last used at `t` (ns), named by a manifest or not.
CachedChunk C(std::string n, uint64_t bytes, int64_t t, bool referenced = false) {
  return {std::move(n), bytes, t, referenced};
}

std::vector<std::string> Evicted(const std::vector<CachedChunk>& chunks, uint64_t keep) {
  std::vector<std::string> out;
  for (size_t i : ChooseEvictions(chunks, keep)) out.push_back(chunks[i].name);
  return out;
}

TEST(ChooseEvictionsTest, LeastRecentlyUsedGoFirstUntilTheRestFit) {
  std::vector<CachedChunk> chunks = {C("new", 10, 300), C("old", 10, 100), C("mid", 10, 200)};
  EXPECT_EQ(Evicted(chunks, 20), std::vector<std::string>{"old"});
  EXPECT_EQ(Evicted(chunks, 19), (std::vector<std::string>{"old", "mid"}));
  EXPECT_EQ(Evicted(chunks, 10), (std::vector<std::string>{"old", "mid"}));
  EXPECT_EQ(Evicted(chunks, 9), (std::vector<std::string>{"old", "mid", "new"}));
}

TEST(ChooseEvictionsTest, WithinTheLimitNothingGoes) {
  std::vector<CachedChunk> chunks = {C("a", 10, 1), C("b", 20, 2)};
  EXPECT_TRUE(Evicted(chunks, 30).empty());
  EXPECT_TRUE(Evicted(chunks, UINT64_MAX).empty());
  EXPECT_TRUE(Evicted({}, 0).empty());
}

TEST(ChooseEvictionsTest, LimitZeroEvictsEveryUnreferencedChunk) {
  std::vector<CachedChunk> chunks = {C("b", 20, 2), C("live", 5, 0, true), C("a", 10, 1)};
  EXPECT_EQ(Evicted(chunks, 0), (std::vector<std::string>{"a", "b"}));
}

TEST(ChooseEvictionsTest, AReferencedChunkIsNeverEvictedAndDoesNotCount) {
  // The oldest and largest is named by a manifest: it stays, and the limit
  // is for the unreferenced ones alone.
  std::vector<CachedChunk> chunks = {C("live", 1000, 0, true), C("a", 10, 1), C("b", 10, 2)};
  EXPECT_EQ(Evicted(chunks, 10), std::vector<std::string>{"a"});
  EXPECT_TRUE(Evicted({C("live", 1000, 0, true)}, 0).empty());
}

TEST(ChooseEvictionsTest, StrictlyByAgeEvenWhenAnOldSmallOneWouldNotHaveHadToGo) {
  // LRU, not a best fit: the old small chunk goes before the newer large one.
  std::vector<CachedChunk> chunks = {C("small-old", 1, 1), C("large-new", 64, 2)};
  EXPECT_EQ(Evicted(chunks, 10), (std::vector<std::string>{"small-old", "large-new"}));
  // And once the rest fit, it stops: the large old one was enough.
  EXPECT_EQ(Evicted({C("large-old", 64, 1), C("small-new", 1, 2)}, 10), std::vector<std::string>{"large-old"});
}

TEST(ChooseEvictionsTest, TiesGoByName) {
  std::vector<CachedChunk> chunks = {C("b", 10, 5), C("a", 10, 5), C("c", 10, 5)};
  EXPECT_EQ(Evicted(chunks, 10), (std::vector<std::string>{"a", "b"}));
}

TEST(DecideSweepTest, WithALimitTheLeastRecentlyUsedOrphansGoAndTheRestAreCached) {
  std::string live = Hex('1'), old_orphan = Hex('2'), new_orphan = Hex('3');
  std::string tmp = "33/" + new_orphan + ".tmp-41-0123456789abcdef";
  GcResult r = DecideSweep({live},
                           {{"11/" + live, 100, 0, 1},  // the oldest of all, but named
                            {"22/" + old_orphan, 30, 0, 2},
                            {"33/" + new_orphan, 40, 0, 3},
                            {tmp, 7, 7200, 0}},
                           3600, 50);
  EXPECT_EQ(Names(r), (std::vector<std::string>{"22/" + old_orphan + " unreferenced, least recently used",
                                                tmp + " stale temporary"}));
  EXPECT_EQ(r.removed_bytes, 37u);
  EXPECT_EQ(r.kept_chunks, 1u);
  EXPECT_EQ(r.kept_bytes, 100u);
  EXPECT_EQ(r.cached_chunks, 1u);
  EXPECT_EQ(r.cached_bytes, 40u);
  EXPECT_EQ(r.keep_unused_bytes, 50u);
}

TEST(DecideSweepTest, WithoutALimitNothingIsCached) {
  std::string a = Hex('a'), b = Hex('b');
  GcResult r = DecideSweep({}, {{"aa/" + a, 10, 0, 2}, {"bb/" + b, 10, 0, 1}}, 3600, 0);
  EXPECT_EQ(Names(r), (std::vector<std::string>{"bb/" + b + " unreferenced", "aa/" + a + " unreferenced"}));
  EXPECT_EQ(r.cached_chunks, 0u);
  EXPECT_EQ(r.cached_bytes, 0u);
}

// --- the lock ----------------------------------------------------------------

class ChunkGcStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpusnap-chunk-gc-test-XXXXXX";
    root_ = ::mkdtemp(tmpl);
    auto store = Store::Open(root_, true);
    ASSERT_TRUE(store.ok());
    store_.emplace(std::move(store).value());
    auto chunks = ChunkStore::Open(root_);
    ASSERT_TRUE(chunks.ok());
    chunks_.emplace(std::move(chunks).value());
  }
  void TearDown() override { (void)RemoveTree(root_); }

  // A chunk of `length` bytes of `fill`, stored.
  ChunkRef Save(char fill, uint64_t length = 4096) {
    std::string bytes(length, fill);
    auto ref = chunks_->SaveChunk(bytes.data(), bytes.size());
    EXPECT_TRUE(ref.ok()) << ref.status().ToString();
    return *ref;
  }

  // A published gpushare snapshot whose process 2 names `refs`.
  void Publish(const std::string& id, const std::vector<ChunkRef>& refs) {
    auto pending = store_->Begin(id);
    ASSERT_TRUE(pending.ok()) << pending.status().ToString();
    ASSERT_TRUE(MakeDirs(pending->dir() + "/gpu").ok());
    ASSERT_TRUE(WriteFileSynced(pending->dir() + "/" + ChunkManifestName(2), EncodeChunkManifest(ManifestOf(refs))).ok());
    SnapshotMeta m = BarePidMeta(id);
    m.gpu.emplace();
    m.gpu->driver_version = "580.159.04";
    m.gpu->gpushare = true;
    m.gpu->ns_pids = {2};
    m.gpu->restore_tids = {3};
    m.gpu->control_sockets = {"gpusnap-gpushare.1.2"};
    m.gpu->chunk_store = root_;
    Status published = pending->Publish(m);
    ASSERT_TRUE(published.ok()) << published.ToString();
  }

  Result<GcResult> Collect(bool dry_run, uint64_t keep_unused_bytes = 0) {
    GPUSNAP_ASSIGN_OR_RETURN(auto lock, ChunkStoreLock::Acquire(root_, ChunkStoreLock::Mode::kExclusive, 0));
    return CollectChunks(*store_, lock, dry_run, keep_unused_bytes);
  }

  bool Exists(const ChunkRef& ref) { return ::access(chunks_->ChunkPath(ref.digest).c_str(), F_OK) == 0; }
  void ExpectRefusal(const std::function<void(const std::string& dir)>& spoil, Code code, const std::string& named);

  std::string root_;
  std::optional<Store> store_;
  std::optional<ChunkStore> chunks_;
};

TEST_F(ChunkGcStoreTest, SharedHoldersShareAndExcludeACollection) {
  auto a = ChunkStoreLock::Acquire(root_, ChunkStoreLock::Mode::kShared, 0);
  auto b = ChunkStoreLock::Acquire(root_, ChunkStoreLock::Mode::kShared, 0);
  ASSERT_TRUE(a.ok() && b.ok());
  auto gc = ChunkStoreLock::Acquire(root_, ChunkStoreLock::Mode::kExclusive, 50);
  ASSERT_FALSE(gc.ok());
  EXPECT_EQ(gc.status().code(), Code::kTimeout);
  EXPECT_NE(gc.status().message().find(ChunkStoreLockPath(root_)), std::string::npos) << gc.status().message();
}

TEST_F(ChunkGcStoreTest, ACollectionExcludesWriters) {
  auto gc = ChunkStoreLock::Acquire(root_, ChunkStoreLock::Mode::kExclusive, 0);
  ASSERT_TRUE(gc.ok());
  auto writer = ChunkStoreLock::Acquire(root_, ChunkStoreLock::Mode::kShared, 0);
  ASSERT_FALSE(writer.ok());
  EXPECT_NE(writer.status().message().find("garbage collection"), std::string::npos);
}

TEST_F(ChunkGcStoreTest, CollectingUnderASharedLockIsRefused) {
  auto lock = ChunkStoreLock::Acquire(root_, ChunkStoreLock::Mode::kShared, 0);
  ASSERT_TRUE(lock.ok());
  EXPECT_EQ(CollectChunks(*store_, *lock, true, 0).status().code(), Code::kInternal);
}

// --- mark and sweep over a real store ----------------------------------------

TEST_F(ChunkGcStoreTest, KeepsWhatAnySnapshotNamesAndSweepsTheRest) {
  ChunkRef shared = Save('s'), only_a = Save('a'), orphan = Save('o', 100);
  Publish("a", {shared, only_a});
  Publish("b", {shared});
  auto dry = Collect(true);
  ASSERT_TRUE(dry.ok()) << dry.status().ToString();
  ASSERT_EQ(dry->removed.size(), 1u);
  EXPECT_EQ(dry->removed[0].path, chunks_->ChunkPath(orphan.digest));
  EXPECT_EQ(dry->removed_bytes, 100u);
  EXPECT_EQ(dry->kept_chunks, 2u);
  EXPECT_EQ(dry->manifests, 2u);
  EXPECT_TRUE(Exists(orphan));  // a dry run deletes nothing

  ASSERT_TRUE(store_->Remove("a").ok());
  auto r = Collect(false);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->removed.size(), 2u);
  EXPECT_FALSE(Exists(orphan));
  EXPECT_FALSE(Exists(only_a));
  EXPECT_TRUE(Exists(shared));
  // Fan-out directories emptied go too.
  std::string dir = chunks_->ChunkPath(orphan.digest);
  EXPECT_NE(::access(dir.substr(0, dir.rfind('/')).c_str(), F_OK), 0);
}

TEST_F(ChunkGcStoreTest, AManifestWithScratchChunksIsReadAndNamesOnlyItsStoredChunks) {
  ChunkRef kept = Save('k'), orphan = Save('o');
  Publish("s", {Scratch(), kept, Scratch(4096)});  // written as version 3
  auto r = Collect(false);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->kept_chunks, 1u);
  ASSERT_EQ(r->removed.size(), 1u);
  EXPECT_EQ(r->removed[0].path, chunks_->ChunkPath(orphan.digest));
  EXPECT_TRUE(Exists(kept));
}

TEST_F(ChunkGcStoreTest, ManifestsOfSnapshotsBeingWrittenAndSuspendedProcessesCount) {
  ChunkRef pending_ref = Save('p'), suspended_ref = Save('q'), dead_ref = Save('d');
  auto pending = store_->Begin("live");  // its writer holds it
  ASSERT_TRUE(pending.ok());
  ASSERT_TRUE(MakeDirs(pending->dir() + "/gpu").ok());
  ASSERT_TRUE(WriteFileSynced(pending->dir() + "/gpu/2.chunks", EncodeChunkManifest(ManifestOf({pending_ref}))).ok());
  std::string suspended = SuspendedRoot(root_) + "/4711";
  ASSERT_TRUE(MakeDirs(suspended).ok());
  ASSERT_TRUE(WriteFileSynced(suspended + "/2.chunks", EncodeChunkManifest(ManifestOf({suspended_ref}))).ok());
  // A dead writer's leftover: no lock on it.
  std::string dead = store_->SnapshotsDir() + "/.tmp-dead";
  ASSERT_TRUE(MakeDirs(dead + "/gpu").ok());
  ASSERT_TRUE(WriteFileSynced(dead + "/gpu/2.chunks", EncodeChunkManifest(ManifestOf({dead_ref}))).ok());

  auto dry = Collect(true);
  ASSERT_TRUE(dry.ok()) << dry.status().ToString();
  ASSERT_EQ(dry->removed.size(), 1u);
  EXPECT_EQ(dry->removed[0].path, chunks_->ChunkPath(dead_ref.digest));
  EXPECT_TRUE(std::filesystem::exists(dead));  // a dry run leaves the leftover too
  auto r = Collect(false);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(std::filesystem::exists(dead));
  EXPECT_TRUE(Exists(pending_ref));
  EXPECT_TRUE(Exists(suspended_ref));
  EXPECT_FALSE(Exists(dead_ref));
}

// Snapshot `a` and an orphan chunk; `spoil` breaks `a`; the collection must
// refuse, with `code`, naming `named`, and delete nothing.
void ChunkGcStoreTest::ExpectRefusal(const std::function<void(const std::string& dir)>& spoil, Code code,
                                     const std::string& named) {
  ChunkRef orphan = Save('o');
  Publish("a", {Save('a')});
  spoil(store_->SnapshotDir("a"));
  auto r = Collect(false);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), code) << r.status().message();
  EXPECT_NE(r.status().message().find("refused, nothing deleted"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(named), std::string::npos) << r.status().message();
  EXPECT_TRUE(Exists(orphan));
}

TEST_F(ChunkGcStoreTest, ACorruptManifestRefusesNamingIt) {
  ExpectRefusal([](const std::string& dir) { ASSERT_TRUE(WriteFileAtomic(dir + "/gpu/2.chunks", "garbage").ok()); },
                Code::kCorruption, store_->SnapshotDir("a") + "/gpu/2.chunks");
}

TEST_F(ChunkGcStoreTest, AMissingManifestOfAGpushareSnapshotRefuses) {
  ExpectRefusal([](const std::string& dir) { ASSERT_EQ(::unlink((dir + "/gpu/2.chunks").c_str()), 0); },
                Code::kNotFound, store_->SnapshotDir("a") + "/gpu/2.chunks");
}

TEST_F(ChunkGcStoreTest, AnUnreadableSnapshotRefuses) {
  ExpectRefusal([](const std::string& dir) { ASSERT_TRUE(WriteFileAtomic(dir + "/gpusnap.json", "{").ok()); },
                Code::kCorruption, "snapshot `a`");
}

// Sets the chunk's last use to `ago_s` seconds before now.
void UsedAgo(const ChunkStore& chunks, const ChunkRef& ref, int64_t ago_s) {
  struct timespec times[2] = {{0, UTIME_OMIT}, {::time(nullptr) - ago_s, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, chunks.ChunkPath(ref.digest).c_str(), times, 0), 0);
}

TEST_F(ChunkGcStoreTest, ALimitKeepsTheMostRecentlyUsedOrphansAndNeverANamedChunk) {
  ChunkRef named = Save('n', 1000), oldest = Save('o', 100), older = Save('p', 100), newest = Save('q', 100);
  Publish("a", {named});
  UsedAgo(*chunks_, named, 9000);  // older than any orphan, and still kept
  UsedAgo(*chunks_, oldest, 3000);
  UsedAgo(*chunks_, older, 2000);
  UsedAgo(*chunks_, newest, 1000);
  // A load of the oldest makes it the most recently used.
  std::string back(100, '\0');
  ASSERT_TRUE(chunks_->Load({0, 100, 0, {oldest}}, back.data(), back.size()).ok());

  auto dry = Collect(true, 200);
  ASSERT_TRUE(dry.ok()) << dry.status().ToString();
  ASSERT_EQ(dry->removed.size(), 1u);
  EXPECT_EQ(dry->removed[0].path, chunks_->ChunkPath(older.digest));
  EXPECT_EQ(dry->removed[0].reason, "unreferenced, least recently used");
  EXPECT_EQ(dry->cached_chunks, 2u);
  EXPECT_EQ(dry->cached_bytes, 200u);
  EXPECT_EQ(dry->keep_unused_bytes, 200u);
  EXPECT_TRUE(Exists(older));  // a dry run deletes nothing

  auto r = Collect(false, 200);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(Exists(older));
  EXPECT_TRUE(Exists(oldest));
  EXPECT_TRUE(Exists(newest));
  EXPECT_TRUE(Exists(named));
  // Without a limit, as before: every orphan goes, the named chunk stays.
  auto all = Collect(false);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(all->removed.size(), 2u);
  EXPECT_TRUE(Exists(named));
  EXPECT_FALSE(Exists(oldest));
  EXPECT_FALSE(Exists(newest));
}

TEST_F(ChunkGcStoreTest, ACorruptManifestRefusesWithALimitToo) {
  ChunkRef orphan = Save('o');
  Publish("a", {Save('a')});
  ASSERT_TRUE(WriteFileAtomic(store_->SnapshotDir("a") + "/gpu/2.chunks", "garbage").ok());
  auto r = Collect(false, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("refused, nothing deleted"), std::string::npos) << r.status().message();
  EXPECT_TRUE(Exists(orphan));
}

TEST_F(ChunkGcStoreTest, OldTemporariesOfChunkWritesGo) {
  ChunkRef kept = Save('k');
  std::string chunk = chunks_->ChunkPath(kept.digest);
  std::string old_tmp = chunk + ".tmp-1-00000000deadbeef", new_tmp = chunk + ".tmp-2-00000000deadbeef";
  ASSERT_TRUE(WriteFileSynced(old_tmp, "x").ok());
  ASSERT_TRUE(WriteFileSynced(new_tmp, "y").ok());
  struct timespec times[2] = {{0, UTIME_OMIT}, {::time(nullptr) - 2 * kChunkTempMaxAgeS, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, old_tmp.c_str(), times, 0), 0);
  Publish("a", {kept});
  auto r = Collect(false);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->removed.size(), 1u);
  EXPECT_EQ(r->removed[0].path, old_tmp);
  EXPECT_EQ(r->removed[0].reason, "stale temporary");
  EXPECT_TRUE(std::filesystem::exists(new_tmp));
  EXPECT_TRUE(Exists(kept));
}

}  // namespace
}  // namespace gpusnap::chunks
