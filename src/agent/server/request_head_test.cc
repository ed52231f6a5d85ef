#include "agent/server/request_head.h"

#include <gtest/gtest.h>

#include <string>

namespace gpusnap::agent {
namespace {

TEST(AgentRequestHead, EndsAtTheFirstEmptyLine) {
  RequestHeadScanner head;
  std::string request = "GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n";
  EXPECT_EQ(head.Feed(request + "{\"body\": 1}"), request.size());
  EXPECT_TRUE(head.complete());
  EXPECT_EQ(head.head_bytes(), request.size());
  EXPECT_EQ(head.Feed("more"), 0u);
}

TEST(AgentRequestHead, ByteByByteAsTheLineReaderReads) {
  RequestHeadScanner head;
  std::string request = "POST /v1/checkpoints HTTP/1.1\r\nContent-Length: 2\r\nX: \r\r\n\r\n";
  for (size_t i = 0; i < request.size(); ++i) {
    EXPECT_FALSE(head.complete()) << i;
    EXPECT_EQ(head.Feed(request.substr(i, 1)), 1u);
  }
  EXPECT_TRUE(head.complete());
  EXPECT_EQ(head.Feed("{}"), 0u);
}

TEST(AgentRequestHead, DrippedHeaderLinesNeverEndIt) {
  RequestHeadScanner head;
  head.Feed("GET / HTTP/1.1\r\n");
  for (int i = 0; i < 1000; ++i) head.Feed("X-Slow: y\r\n");
  EXPECT_FALSE(head.complete());
  EXPECT_EQ(head.head_bytes(), 16u + 1000u * 11u);
}

TEST(AgentRequestHead, ABareNewlineIsNoEmptyLine) {
  RequestHeadScanner head;
  head.Feed("GET / HTTP/1.1\r\n\n\nX: y\n");
  EXPECT_FALSE(head.complete());
  head.Feed("\r\n");
  EXPECT_TRUE(head.complete());
}

TEST(AgentRequestHead, AnEmptyFirstLineIsNotTheEnd) {
  // The request line itself cannot be the empty line that ends the head.
  RequestHeadScanner head;
  head.Feed("\r\n");
  EXPECT_FALSE(head.complete());
}

}  // namespace
}  // namespace gpusnap::agent
