#include "server/metrics/client_series.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace materializer::metrics {
namespace {

using ::testing::ElementsAre;
using ::testing::Field;

std::vector<std::string> Names(const std::vector<ClientFigures>& series) {
  std::vector<std::string> names;
  for (const ClientFigures& c : series) names.push_back(c.client);
  return names;
}

TEST(BoundClientSeriesTest, FewClientsKeepTheirNamesLargestFirst) {
  auto series = BoundClientSeries(
      {{"bob", 10, 0, 1}, {"alice", 0, 30, 2}, {"carol", 5, 5, 1}}, 3);
  EXPECT_THAT(Names(series), ElementsAre("alice", "bob", "carol"));
}

TEST(BoundClientSeriesTest, TheRestAreSummedUnderOther) {
  std::vector<ClientFigures> clients;
  for (int i = 0; i < 100; ++i) {
    clients.push_back({"c" + std::to_string(i), static_cast<uint64_t>(i),
                       static_cast<uint64_t>(2 * i), 1});
  }
  auto series = BoundClientSeries(clients, 2);
  ASSERT_EQ(series.size(), 3u);
  EXPECT_THAT(Names(series), ElementsAre("c99", "c98", kOtherClients));
  // c0..c97: reserved 0+..+97, in use twice that, 98 handles.
  EXPECT_EQ(series[2].reserved_bytes, 97u * 98 / 2);
  EXPECT_EQ(series[2].in_use_bytes, 97u * 98);
  EXPECT_EQ(series[2].handles, 98u);
}

TEST(BoundClientSeriesTest, TiesGoByNameAndZeroLimitSumsEveryone) {
  auto tied = BoundClientSeries({{"b", 1, 0, 1}, {"a", 1, 0, 1}}, 1);
  EXPECT_THAT(Names(tied), ElementsAre("a", kOtherClients));
  auto none = BoundClientSeries({{"b", 1, 0, 1}, {"a", 2, 0, 1}}, 0);
  EXPECT_THAT(none, ElementsAre(AllOf(
                        Field(&ClientFigures::client, kOtherClients),
                        Field(&ClientFigures::reserved_bytes, 3u),
                        Field(&ClientFigures::handles, 2u))));
  EXPECT_TRUE(BoundClientSeries({}, 5).empty());
}

}  // namespace
}  // namespace materializer::metrics
