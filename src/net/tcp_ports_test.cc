#include "net/tcp_ports.h"

#include <gtest/gtest.h>

namespace gpusnap::net {
namespace {

// As /proc/net/tcp shows a listener on 127.0.0.1:29777 (inode 4242), a client
// connected to it, and three closed connections lingering on its port.
constexpr std::string_view kTcp =
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    "   0: 0100007F:7451 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0 100 0 0 10 0\n"
    "   1: 0100007F:7451 0100007F:ADDA 06 00000000:00000000 03:0000176E 00000000     0        0 0 3 0000000082514d65\n"
    "   2: 0100007F:7451 0100007F:ADCC 06 00000000:00000000 03:0000176E 00000000     0        0 0 3 00000000bbb7d2a4\n"
    "   3: 0100007F:1F90 0100007F:ADE0 06 00000000:00000000 03:0000176E 00000000     0        0 0 3 0000000061d604d3\n"
    "   4: 0100007F:ADF0 0100007F:7451 01 00000000:00000000 00:00000000 00000000     0        0 5151 1 0 20 4 30 10 -1\n"
    "   5: garbage\n";

constexpr std::string_view kTcp6 =
    "  sl  local_address                         remote_address                        st tx_queue rx_queue tr "
    "tm->when retrnsmt   uid  timeout inode\n"
    "   0: 00000000000000000000000001000000:1F40 00000000000000000000000000000000:0000 0A 00000000:00000000 "
    "00:00000000 00000000     0        0 777 1 0 100 0 0 10 0\n";

TEST(TcpPorts, ParsesRowsAddressesAndStates) {
  auto rows = ParseProcNetTcp(kTcp, false);
  ASSERT_EQ(rows.size(), 5u);  // the garbage line is skipped
  EXPECT_EQ(rows[0].state, kTcpListen);
  EXPECT_EQ(rows[0].local_port, 29777);
  EXPECT_EQ(rows[0].inode, 4242u);
  EXPECT_EQ(rows[0].local[0], 127);  // network order: 127.0.0.1
  EXPECT_EQ(rows[0].local[3], 1);
  EXPECT_EQ(rows[1].state, kTcpTimeWait);
  EXPECT_EQ(rows[1].remote_port, 0xADDA);
}

TEST(TcpPorts, ParsesIpv6) {
  auto rows = ParseProcNetTcp(kTcp6, true);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_TRUE(rows[0].v6);
  EXPECT_EQ(rows[0].local_port, 8000);
  EXPECT_EQ(rows[0].local[15], 1);  // ::1
  EXPECT_EQ(rows[0].local[0], 0);
}

TEST(TcpPorts, OnlyTheTreesOwnListenersCount) {
  auto rows = ParseProcNetTcp(kTcp, false);
  auto v6 = ParseProcNetTcp(kTcp6, true);
  rows.insert(rows.end(), v6.begin(), v6.end());
  EXPECT_EQ(ListeningPorts(rows, {4242, 777, 5151}), (std::vector<uint16_t>{8000, 29777}));
  EXPECT_EQ(ListeningPorts(rows, {5151}), std::vector<uint16_t>{});  // a connection, not a listener
  EXPECT_EQ(ListeningPorts(rows, {}), std::vector<uint16_t>{});
}

TEST(TcpPorts, TimeWaitOnTheListenersPortsOnly) {
  auto rows = ParseProcNetTcp(kTcp, false);
  auto lingering = TimeWaitOn(rows, {29777});
  ASSERT_EQ(lingering.size(), 2u);
  EXPECT_EQ(lingering[0].remote_port, 0xADDA);
  EXPECT_EQ(TimeWaitOn(rows, {8080}).size(), 1u);
  EXPECT_TRUE(TimeWaitOn(rows, {1234}).empty());
}

TEST(TcpPorts, SocketInodeOfAnFdLink) {
  EXPECT_EQ(SocketInode("socket:[4242]"), 4242u);
  EXPECT_EQ(SocketInode("socket:[]"), std::nullopt);
  EXPECT_EQ(SocketInode("socket:[abc]"), std::nullopt);
  EXPECT_EQ(SocketInode("pipe:[4242]"), std::nullopt);
  EXPECT_EQ(SocketInode("/dev/null"), std::nullopt);
}

}  // namespace
}  // namespace gpusnap::net
