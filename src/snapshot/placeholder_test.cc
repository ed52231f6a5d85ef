#include "snapshot/placeholder.h"

#include <gtest/gtest.h>

namespace gpusnap {
namespace {

const std::string kId(64, 'a');

TEST(IdlePlaceholder, TheCommandTheWebhookGivesAndThePathsTestsUse) {
  EXPECT_TRUE(IsPlaceholderCommand({"/gpusnap/bin/gpusnap", "__placeholder"}));
  EXPECT_TRUE(IsPlaceholderCommand({"gpusnap", "__placeholder"}));
  EXPECT_FALSE(IsPlaceholderCommand({"/gpusnap/bin/gpusnap", "__reaper"}));
  EXPECT_FALSE(IsPlaceholderCommand({"/bin/sh", "__placeholder"}));
  EXPECT_FALSE(IsPlaceholderCommand({"/gpusnap/bin/gpusnap", "__placeholder", "--wait"}));
  EXPECT_FALSE(IsPlaceholderCommand({}));
}

TEST(IdlePlaceholder, AnIdlePlaceholderIsAccepted) {
  EXPECT_TRUE(CheckIdlePlaceholder(kId, 42, {"/gpusnap/bin/gpusnap", "__placeholder"}, 0).ok());
}

TEST(IdlePlaceholder, AnotherInitIsRefusedNamingIt) {
  Status st = CheckIdlePlaceholder(kId, 42, {"/bin/sleep", "1000"}, 0);
  EXPECT_EQ(st.code(), Code::kFailedPrecondition);
  EXPECT_NE(st.message().find("container " + kId + " is not an idle gpusnap placeholder"), std::string::npos);
  EXPECT_NE(st.message().find("`/bin/sleep 1000`"), std::string::npos);
}

TEST(IdlePlaceholder, ABusyPlaceholderIsRefused) {
  Status st = CheckIdlePlaceholder(kId, 42, {"/gpusnap/bin/gpusnap", "__placeholder"}, 3);
  EXPECT_EQ(st.code(), Code::kFailedPrecondition);
  EXPECT_NE(st.message().find("is not an idle gpusnap placeholder"), std::string::npos);
  EXPECT_NE(st.message().find("3 process(es)"), std::string::npos);
}

}  // namespace
}  // namespace gpusnap
