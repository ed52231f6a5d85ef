#include "util/heap.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdlib>
#include <thread>

namespace gpusnap {
namespace {

// What the heap's arenas hold free after a thread of its own allocated and
// freed a 4 MiB block twice, as the agent's jobs do with their file buffers.
size_t FreeHeapBytesAfterTwoLargeBlocks() {
  size_t before = 0, after = 0;
  std::thread([&] {
    before = mallinfo2().fordblks;
    for (int i = 0; i < 2; ++i) {
      void* volatile block = std::malloc(4 << 20);
      static_cast<char*>(block)[0] = 1;
      std::free(block);
    }
    after = mallinfo2().fordblks;
  }).join();
  return after > before ? after - before : 0;
}

TEST(Heap, LargeBlocksAreNotKeptByTheHeapOnceFreed) {
  ASSERT_TRUE(MapLargeAllocations(kLargeAllocationBytes).ok());
  // Without the setting, glibc 2.36 keeps the second block: about 4 MiB more free in the heap.
  EXPECT_LT(FreeHeapBytesAfterTwoLargeBlocks(), size_t{1} << 20);
}

TEST(Heap, AThresholdTheLibraryCannotTakeIsRefused) {
  EXPECT_EQ(MapLargeAllocations(0).code(), Code::kInvalidArgument);
  EXPECT_EQ(MapLargeAllocations(size_t{1} << 40).code(), Code::kInvalidArgument);
  ASSERT_TRUE(MapLargeAllocations(kLargeAllocationBytes).ok());
}

}  // namespace
}  // namespace gpusnap
