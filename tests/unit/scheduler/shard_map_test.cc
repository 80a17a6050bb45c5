#include "scheduler/shard_map.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace trellis {
namespace {

using ::testing::HasSubstr;

v1::KeySpec Key(uint64_t id, int64_t n, std::string name = "") {
  v1::KeySpec k;
  k.set_id(id);
  k.set_name(std::move(name));
  k.set_num_elements(n);
  k.set_dtype(v1::DTYPE_FLOAT32);
  return k;
}

// (offset, num_elements, server) of every slice of key i.
std::vector<std::tuple<int64_t, int64_t, int32_t>> Slices(const v1::ShardMap& m, int i) {
  std::vector<std::tuple<int64_t, int64_t, int32_t>> out;
  for (const auto& s : m.keys(i).slices()) out.emplace_back(s.offset(), s.num_elements(), s.server());
  return out;
}

using T = std::tuple<int64_t, int64_t, int32_t>;

TEST(SchedulerShardMap, RoundRobinFollowsTheP3RuleAcrossKeys) {
  // 16-byte slices = 4 floats. Declared out of order; the map sorts by id: 5, 7, 10.
  // Global slice sequence: k5.s0 k7.s0 k10.s0 k10.s1 k10.s2 -> servers 0 1 2 0 1.
  auto m = BuildShardMap({Key(10, 10), Key(5, 4), Key(7, 1)}, 3, "roundRobin", 16);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->keys_size(), 3);
  EXPECT_EQ(m->keys(0).key().id(), 5u);
  EXPECT_EQ(m->keys(1).key().id(), 7u);
  EXPECT_EQ(m->keys(2).key().id(), 10u);
  EXPECT_EQ(Slices(*m, 0), (std::vector<T>{{0, 4, 0}}));
  EXPECT_EQ(Slices(*m, 1), (std::vector<T>{{0, 1, 1}}));  // a 1-element key is one slice
  EXPECT_EQ(Slices(*m, 2), (std::vector<T>{{0, 4, 2}, {4, 4, 0}, {8, 2, 1}}));  // last shorter
  EXPECT_EQ(m->keys(2).slices(2).index(), 2u);
  EXPECT_THAT(m->server_bytes(), ::testing::ElementsAre(32, 12, 16));
  EXPECT_EQ(m->slice_bytes(), 16);
  EXPECT_EQ(m->dispatch(), "roundRobin");
  EXPECT_EQ(m->num_servers(), 3);
}

TEST(SchedulerShardMap, KeysOfOneOrTwoSlicesFromOneMiBAreCutInHalves) {
  constexpr int64_t kMiB = 1 << 20;
  constexpr int64_t kF = kMiB / 4;  // floats per MiB
  // 4 MiB slices: under 1 MiB one slice; 1 MiB two halves on two servers; 6 MiB two
  // equal halves (not 4 + 2); 8 MiB and up plain 4 MiB slices.
  auto m = BuildShardMap({Key(1, kF - 1), Key(2, kF), Key(3, 6 * kF + 1), Key(4, 8 * kF)}, 2,
                         "roundRobin", 4 * kMiB);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_THAT(Slices(*m, 0), ::testing::ElementsAre(T{0, kF - 1, 0}));
  EXPECT_THAT(Slices(*m, 1), ::testing::ElementsAre(T{0, kF / 2, 1}, T{kF / 2, kF / 2, 0}));
  EXPECT_THAT(Slices(*m, 2),
              ::testing::ElementsAre(T{0, 3 * kF + 1, 1}, T{3 * kF + 1, 3 * kF, 0}));
  EXPECT_THAT(Slices(*m, 3), ::testing::ElementsAre(T{0, 4 * kF, 1}, T{4 * kF, 4 * kF, 0}));
  // A map built so passes the checks a restarted scheduler makes of a worker's copy.
  EXPECT_TRUE(ValidateShardMap(*m, 2, "roundRobin", 4 * kMiB).ok());

  // A slice size above 8 MiB asks for whole tensors: one slice per key however big.
  auto whole = BuildShardMap({Key(2, kF), Key(3, 6 * kF)}, 1, "roundRobin", 1 << 30);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_THAT(Slices(*whole, 0), ::testing::ElementsAre(T{0, kF, 0}));
  EXPECT_THAT(Slices(*whole, 1), ::testing::ElementsAre(T{0, 6 * kF, 0}));
  // A smaller sliceBytes cuts as given (1 MiB in 512 KiB slices).
  auto small = BuildShardMap({Key(2, kF)}, 1, "roundRobin", kMiB / 2);
  ASSERT_TRUE(small.ok()) << small.status().ToString();
  EXPECT_THAT(Slices(*small, 0), ::testing::ElementsAre(T{0, kF / 2, 0}, T{kF / 2, kF / 2, 0}));
}

TEST(SchedulerShardMap, RoundRobinSequenceContinuesOverKeyBoundaries) {
  // Two keys of 3 slices each on 2 servers: 0 1 0 | 1 0 1 (not 0 1 0 | 0 1 0).
  auto m = BuildShardMap({Key(1, 12), Key(2, 12)}, 2, "roundRobin", 16);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(Slices(*m, 0), (std::vector<T>{{0, 4, 0}, {4, 4, 1}, {8, 4, 0}}));
  EXPECT_EQ(Slices(*m, 1), (std::vector<T>{{0, 4, 1}, {4, 4, 0}, {8, 4, 1}}));
}

TEST(SchedulerShardMap, SameMapWhateverTheDeclarationOrder) {
  std::mt19937_64 rng(7);
  std::vector<v1::KeySpec> keys;
  for (int i = 0; i < 300; ++i) keys.push_back(Key(rng(), 1 + static_cast<int64_t>(rng() % 5000)));
  for (const char* d : {"roundRobin", "hash", "balanced"}) {
    auto a = BuildShardMap(keys, 5, d, 1024);
    auto shuffled = keys;
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    auto b = BuildShardMap(shuffled, 5, d, 1024);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->SerializeAsString(), b->SerializeAsString()) << d;
  }
}

TEST(SchedulerShardMap, SplitMix64DocumentedValues) {
  // The first two outputs of the reference splitmix64 generator seeded with 0.
  EXPECT_EQ(SplitMix64(0), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(SplitMix64(0x9e3779b97f4a7c15ULL), 0x6e789e6aa1b965f4ULL);
  EXPECT_EQ(SplitMix64(1), 0x910a2dec89025cc1ULL);
  EXPECT_EQ(SplitMix64(42), 0xbdd732262feb6e95ULL);
}

TEST(SchedulerShardMap, HashPutsAllSlicesOfAKeyOnOneStableServer) {
  // SplitMix64(id) % 4 for ids 0, 1, 2, 3, 42, 1000 = 3, 1, 2, 1, 1, 0.
  auto m = BuildShardMap({Key(0, 9), Key(1, 1), Key(2, 4), Key(3, 5), Key(42, 8), Key(1000, 2)},
                         4, "hash", 16);
  ASSERT_TRUE(m.ok());
  const int32_t expected[] = {3, 1, 2, 1, 1, 0};
  for (int i = 0; i < m->keys_size(); ++i) {
    for (const auto& s : m->keys(i).slices()) EXPECT_EQ(s.server(), expected[i]) << "key " << i;
  }
  EXPECT_EQ(m->keys(0).slices_size(), 3);  // still cut into slices
  EXPECT_THAT(m->server_bytes(), ::testing::ElementsAre(8, 56, 16, 36));
}

TEST(SchedulerShardMap, BalancedTiesGoToTheLowestRank) {
  // Slices of 16, 16, 8, 4 bytes onto 2 servers: 16->0, 16->1, 8->0, 4->1.
  auto m = BuildShardMap({Key(1, 8), Key(2, 2), Key(3, 1)}, 2, "balanced", 16);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(Slices(*m, 0), (std::vector<T>{{0, 4, 0}, {4, 4, 1}}));
  EXPECT_EQ(Slices(*m, 1), (std::vector<T>{{0, 2, 0}}));
  EXPECT_EQ(Slices(*m, 2), (std::vector<T>{{0, 1, 1}}));
  EXPECT_THAT(m->server_bytes(), ::testing::ElementsAre(24, 20));
}

TEST(SchedulerShardMap, BalancedIsWithinOneSliceOfOptimalOnRandomKeySets) {
  std::mt19937_64 rng(2024);
  for (int trial = 0; trial < 200; ++trial) {
    const int32_t servers = 1 + static_cast<int32_t>(rng() % 16);
    const int64_t slice_bytes = 4 * (1 + static_cast<int64_t>(rng() % 1024));
    const int nkeys = 1 + static_cast<int>(rng() % 60);
    std::vector<v1::KeySpec> keys;
    for (int i = 0; i < nkeys; ++i) keys.push_back(Key(rng(), 1 + static_cast<int64_t>(rng() % 20000)));
    auto m = BuildShardMap(keys, servers, "balanced", slice_bytes);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    int64_t total = 0, largest = 0;
    std::vector<int64_t> load(static_cast<size_t>(servers), 0);
    for (const auto& ks : m->keys()) {
      int64_t next = 0;  // slices tile the key exactly
      for (const auto& s : ks.slices()) {
        ASSERT_EQ(s.offset(), next);
        ASSERT_GE(s.num_elements(), 1);
        ASSERT_LE(s.num_elements() * 4, slice_bytes);
        ASSERT_GE(s.server(), 0);
        ASSERT_LT(s.server(), servers);
        next += s.num_elements();
        const int64_t b = s.num_elements() * 4;
        load[static_cast<size_t>(s.server())] += b;
        total += b;
        largest = std::max(largest, b);
      }
      ASSERT_EQ(next, ks.key().num_elements());
    }
    for (int32_t r = 0; r < servers; ++r) ASSERT_EQ(m->server_bytes(r), load[static_cast<size_t>(r)]);
    const int64_t lower_bound = (total + servers - 1) / servers;
    const int64_t max_load = *std::max_element(load.begin(), load.end());
    EXPECT_LE(max_load - lower_bound, largest) << "trial " << trial;
  }
}

TEST(SchedulerShardMap, RejectsBadInput) {
  auto err = [](std::vector<v1::KeySpec> keys, int32_t s, const char* d, int64_t sb) {
    auto m = BuildShardMap(std::move(keys), s, d, sb);
    EXPECT_FALSE(m.ok());
    return m.status().message();
  };
  EXPECT_THAT(err({Key(3, 4, "a"), Key(3, 8, "b")}, 2, "roundRobin", 16),
              HasSubstr("duplicate key id 3"));
  EXPECT_THAT(err({Key(3, 0, "w")}, 2, "roundRobin", 16),
              HasSubstr("key 3 \"w\": num_elements must be >= 1, got 0"));
  v1::KeySpec no_dtype = Key(4, 4);
  no_dtype.set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_THAT(err({no_dtype}, 2, "roundRobin", 16), HasSubstr("dtype must be set"));
  EXPECT_THAT(err({Key(1, 4)}, 0, "roundRobin", 16),
              HasSubstr("number of servers must be >= 1, got 0"));
  EXPECT_THAT(err({Key(1, 4)}, 1, "roundRobin", 2), HasSubstr("sliceBytes must be >= 4"));
  EXPECT_THAT(err({Key(1, 4)}, 1, "roundRobin", 6), HasSubstr("multiple of 4"));
  EXPECT_THAT(err({Key(1, 4)}, 1, "random", 16), HasSubstr("got \"random\""));
  auto huge = BuildShardMap({Key(1, int64_t{1} << 40)}, 1, "roundRobin", 4);
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted);
}

TEST(SchedulerShardMap, NoKeysGiveAnEmptyMap) {
  auto m = BuildShardMap({}, 3, "balanced", 16);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->keys_size(), 0);
  EXPECT_THAT(m->server_bytes(), ::testing::ElementsAre(0, 0, 0));
}

}  // namespace
}  // namespace trellis

namespace trellis {
namespace {

// Deferred init: existing slices stay where they are; added keys are merged in id order.
TEST(SchedulerShardMapExtend, KeepsTheBaseAndAddsKeysInIdOrder) {
  auto base = BuildShardMap({Key(10, 10), Key(5, 4)}, 3, "roundRobin", 16);
  ASSERT_TRUE(base.ok());
  auto ext = ExtendShardMap(*base, {Key(12, 8, "late"), Key(7, 1)});
  ASSERT_TRUE(ext.ok()) << ext.status().ToString();
  ASSERT_EQ(ext->keys_size(), 4);
  EXPECT_EQ(ext->keys(0).key().id(), 5u);
  EXPECT_EQ(ext->keys(1).key().id(), 7u);
  EXPECT_EQ(ext->keys(2).key().id(), 10u);
  EXPECT_EQ(ext->keys(3).key().id(), 12u);
  EXPECT_EQ(Slices(*ext, 0), Slices(*base, 0));
  EXPECT_EQ(Slices(*ext, 2), Slices(*base, 1));
  // The added keys as a map of their own: 7.s0 12.s0 12.s1 -> servers 0 1 2.
  EXPECT_EQ(Slices(*ext, 1), (std::vector<T>{{0, 1, 0}}));
  EXPECT_EQ(Slices(*ext, 3), (std::vector<T>{{0, 4, 1}, {4, 4, 2}}));
  int64_t total = 0;
  for (int64_t b : ext->server_bytes()) total += b;
  EXPECT_EQ(total, (10 + 4 + 8 + 1) * 4);

  auto dup = ExtendShardMap(*base, {Key(5, 4)});
  ASSERT_FALSE(dup.ok());
  EXPECT_THAT(dup.status().message(), HasSubstr("key 5 is already in the shard map"));
}

// A server resize (docs/elastic.md#servers): the same keys cut into the same slices, laid out
// on the new servers with the base's dispatch, in force from the resize's world.
TEST(SchedulerShardMapRelayout, KeepsTheSlicingAndLaysOutOnTheNewServers) {
  auto base = BuildShardMap({Key(10, 10), Key(5, 4)}, 2, "roundRobin", 16);
  ASSERT_TRUE(base.ok());
  auto three = RelayoutShardMap(*base, 3, 1);
  ASSERT_TRUE(three.ok()) << three.status().ToString();
  auto fresh = BuildShardMap({Key(10, 10), Key(5, 4)}, 3, "roundRobin", 16);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(three->num_servers(), 3);
  EXPECT_EQ(three->world_epoch(), 1);
  EXPECT_EQ(three->dispatch(), "roundRobin");
  ASSERT_EQ(three->keys_size(), base->keys_size());
  for (int i = 0; i < base->keys_size(); ++i) {
    EXPECT_EQ(Slices(*three, i), Slices(*fresh, i)) << "as a job of 3 servers lays it out";
    ASSERT_EQ(three->keys(i).slices_size(), base->keys(i).slices_size());
    for (int j = 0; j < base->keys(i).slices_size(); ++j) {
      EXPECT_EQ(three->keys(i).slices(j).offset(), base->keys(i).slices(j).offset());
      EXPECT_EQ(three->keys(i).slices(j).num_elements(), base->keys(i).slices(j).num_elements());
    }
  }
  auto one = RelayoutShardMap(*three, 1, 2);
  ASSERT_TRUE(one.ok());
  for (int i = 0; i < one->keys_size(); ++i) {
    for (const auto& s : one->keys(i).slices()) EXPECT_EQ(s.server(), 0);
  }
  EXPECT_EQ(one->world_epoch(), 2);
  EXPECT_FALSE(RelayoutShardMap(*base, 0, 3).ok()) << "no servers";
}

}  // namespace
}  // namespace trellis
