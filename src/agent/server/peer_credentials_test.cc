#include "agent/server/peer_credentials.h"

#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "util/fd.h"

namespace gpusnap::agent {
namespace {

TEST(UidMayCall, RootAndTheAllowedOnly) {
  EXPECT_TRUE(UidMayCall(0, {}));
  EXPECT_FALSE(UidMayCall(1000, {}));
  EXPECT_TRUE(UidMayCall(1000, {1000, 2000}));
  EXPECT_TRUE(UidMayCall(2000, {1000, 2000}));
  EXPECT_FALSE(UidMayCall(1001, {1000, 2000}));
  EXPECT_FALSE(UidMayCall(static_cast<uid_t>(-1), {1000}));
}

TEST(DescribePeer, NamesUidGidPidAndCommand) {
  EXPECT_EQ(DescribePeer({4242, 1000, 1001}, "curl"), "uid 1000 (gid 1001, pid 4242 `curl`)");
  EXPECT_EQ(DescribePeer({4242, 1000, 1001}, ""), "uid 1000 (gid 1001, pid 4242)");
  // A command is the caller's to choose: it cannot forge the log line.
  EXPECT_EQ(DescribePeer({1, 0, 0}, "a\nb"), "uid 0 (gid 0, pid 1 `a\\x0ab`)");
}

TEST(PeerCredentialsOf, TheKernelNamesTheConnectingProcess) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  UniqueFd a(fds[0]), b(fds[1]);
  auto cred = PeerCredentialsOf(a.get());
  ASSERT_TRUE(cred.has_value());
  EXPECT_EQ(cred->pid, ::getpid());
  EXPECT_EQ(cred->uid, ::getuid());
  EXPECT_EQ(cred->gid, ::getgid());
}

TEST(PeerCredentialsOf, NoneForWhatIsNotAUnixSocket) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  UniqueFd a(fds[0]), b(fds[1]);
  EXPECT_FALSE(PeerCredentialsOf(a.get()).has_value());
}

}  // namespace
}  // namespace gpusnap::agent
