// OutsideTheWorld (agent/agent.h): under restartPolicy Always the agent does not start again a
// program that ended well after a resize took its rank out of the job's world.
#include <gtest/gtest.h>

#include "agent/agent.h"

namespace trellis {
namespace {

v1::WorldInfo World(std::initializer_list<int32_t> members, int32_t servers) {
  v1::WorldInfo w;
  for (int32_t m : members) w.add_members(m);
  w.set_servers(servers);
  return w;
}

TEST(OutsideTheWorldTest, AServerAtOrAboveTheWorldsServersWasResizedAway) {
  const v1::WorldInfo w = World({0, 1}, 1);
  EXPECT_EQ(OutsideTheWorld(v1::ROLE_SERVER, 0, w), "");
  EXPECT_EQ(OutsideTheWorld(v1::ROLE_SERVER, 1, w),
            "server 1 was resized away (the job's world has 1 servers); a grow starts it again");
  EXPECT_NE(OutsideTheWorld(v1::ROLE_SERVER, 2, w), "");
}

TEST(OutsideTheWorldTest, AWorkerNotAmongTheMembersIsOutside) {
  const v1::WorldInfo w = World({0, 2}, 2);
  EXPECT_EQ(OutsideTheWorld(v1::ROLE_WORKER, 0, w), "");
  EXPECT_EQ(OutsideTheWorld(v1::ROLE_WORKER, 2, w), "");
  EXPECT_EQ(OutsideTheWorld(v1::ROLE_WORKER, 1, w),
            "worker 1 is outside the job's world (resized away); a grow starts it again");
}

// A world that says nothing (a scheduler without one yet, servers 0: the job's first count) and
// an agent not registered keep today's restarts.
TEST(OutsideTheWorldTest, AWorldThatSaysNothingRestartsAsBefore) {
  const v1::WorldInfo empty;
  EXPECT_EQ(OutsideTheWorld(v1::ROLE_SERVER, 5, empty), "");
  EXPECT_EQ(OutsideTheWorld(v1::ROLE_WORKER, 5, empty), "");
  EXPECT_EQ(OutsideTheWorld(v1::ROLE_WORKER, -1, World({0}, 1)), "");
  EXPECT_EQ(OutsideTheWorld(v1::ROLE_SERVER, -1, World({0}, 1)), "");
}

}  // namespace
}  // namespace trellis
