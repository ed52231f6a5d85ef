#include "util/progress_bar.h"

#include <gtest/gtest.h>

namespace gpusnap {
namespace {

BarState Running(std::string operation, std::string phase, int percent) {
  BarState s;
  s.operation = std::move(operation);
  s.phase = std::move(phase);
  s.percent = percent;
  return s;
}

TEST(HumanBytes, Units) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(1536), "1.5 KiB");
  EXPECT_EQ(HumanBytes(3ull << 30), "3.0 GiB");
}

TEST(PhasePercent, FollowsTheOrderOfTheOperation) {
  EXPECT_EQ(PhasePercent("checkpoint", "resolve", 0), 20);
  EXPECT_EQ(PhasePercent("checkpoint", "dump", 20), 80);
  EXPECT_EQ(PhasePercent("restore", "criu-restore", 40), 60);
}

TEST(PhasePercent, TheLastPhaseIsNotYetTheEnd) {
  EXPECT_EQ(PhasePercent("checkpoint", "publish", 80), 99);
  EXPECT_EQ(PhasePercent("restore", "gpushare-load", 80), 99);
}

TEST(PhasePercent, UnknownPhasesAndOperationsKeepTheBarWhereItWas) {
  EXPECT_EQ(PhasePercent("checkpoint", "gpu-lock", 20), 20);
  EXPECT_EQ(PhasePercent("gc", "mark", 0), 0);
  EXPECT_EQ(PhasePercent("checkpoint", "resolve", 80), 80);  // never backwards
}

TEST(FormatProgressBar, BeforeTheFirstPhase) {
  BarState s = Running("checkpoint", "", 0);
  EXPECT_EQ(FormatProgressBar(s, 80), "[checkpoint] [------------------------------]   0%  starting  0.0 s");
}

TEST(FormatProgressBar, APhaseDoneWithBytesAndElapsed) {
  BarState s = Running("checkpoint", "dump", 80);
  s.bytes_done = 1536;
  s.elapsed_s = 1.25;
  EXPECT_EQ(FormatProgressBar(s, 80),
            "[checkpoint] [########################------]  80%  dump done  1.5 KiB  1.2 s");
}

TEST(FormatProgressBar, BytesOfAKnownTotal) {
  BarState s = Running("restore", "verify", 20);
  s.bytes_done = 512;
  s.bytes_total = 2048;
  // The bar gives way to the text: 79 characters in all.
  EXPECT_EQ(FormatProgressBar(s, 80),
            "[restore] [#####--------------------]  20%  verify done  512 B / 2.0 KiB  0.0 s");
}

TEST(FormatProgressBar, SucceededIsAFullBar) {
  BarState s = Running("restore", "criu-restore", 60);
  s.end = BarState::End::kSucceeded;
  s.elapsed_s = 0.84;
  EXPECT_EQ(FormatProgressBar(s, 80), "[restore] [##############################] 100%  done  0.8 s");
}

TEST(FormatProgressBar, FailedNamesTheLastPhaseAndKeepsThePercentage) {
  BarState s = Running("checkpoint", "resolve", 20);
  s.end = BarState::End::kFailed;
  EXPECT_EQ(FormatProgressBar(s, 80),
            "[checkpoint] [######------------------------]  20%  failed after resolve  0.0 s");
  s.phase = "";
  s.percent = 0;
  EXPECT_NE(FormatProgressBar(s, 80).find("  0%  failed  0.0 s"), std::string::npos);
}

TEST(FormatProgressBar, NarrowTerminalsShrinkThenDropTheBar) {
  BarState s = Running("checkpoint", "dump", 80);
  std::string line = FormatProgressBar(s, 50);
  EXPECT_EQ(line, "[checkpoint] [########---]  80%  dump done  0.0 s");
  EXPECT_EQ(line.size(), 49u);
  line = FormatProgressBar(s, 40);
  EXPECT_EQ(line, "[checkpoint]  80%  dump done  0.0 s");
  s.phase = "a-phase-name-far-longer-than-the-terminal-is-wide";
  EXPECT_EQ(FormatProgressBar(s, 40).size(), 39u);
}

TEST(FormatProgressBar, ATerminalThatDidNotSayIsEightyWide) {
  BarState s = Running("checkpoint", "dump", 80);
  EXPECT_EQ(FormatProgressBar(s, 0), FormatProgressBar(s, 80));
}

TEST(FormatProgressBar, NeverAControlCharacter) {
  BarState s = Running("checkpoint", "dump", 80);
  s.bytes_total = 1 << 20;
  for (int columns : {0, 20, 33, 80, 200})
    for (char c : FormatProgressBar(s, columns)) EXPECT_GE(static_cast<unsigned char>(c), 0x20) << columns;
}

}  // namespace
}  // namespace gpusnap
