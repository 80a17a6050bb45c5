// OutsideTheWorld (agent/agent.h): under restartPolicy Always the agent does not start again a
// program that ended well after a resize took its rank out of the job's world.
#include <gtest/gtest.h>

#include "agent/agent.h"

namespace trellis {
namespace {

// A scheduler's view of a world of `members` and `servers` in force.
v1::ClusterView World(std::initializer_list<int32_t> members, int32_t servers) {
  v1::ClusterView v;
  for (int32_t m : members) v.mutable_world()->add_members(m);
  v.mutable_world()->set_servers(servers);
  v.set_num_servers(servers);
  return v;
}

TEST(OutsideTheWorldTest, AServerAtOrAboveTheWorldsServersWasResizedAway) {
  const v1::ClusterView w = World({0, 1}, 1);
  EXPECT_EQ(OutsideTheWorld(w, v1::ROLE_SERVER, 0), "");
  EXPECT_EQ(OutsideTheWorld(w, v1::ROLE_SERVER, 1),
            "server 1 was resized away (the job's world has 1 servers); a grow starts it again");
  EXPECT_NE(OutsideTheWorld(w, v1::ROLE_SERVER, 2), "");
}

TEST(OutsideTheWorldTest, AWorkerNotAmongTheMembersIsOutside) {
  const v1::ClusterView w = World({0, 2}, 2);
  EXPECT_EQ(OutsideTheWorld(w, v1::ROLE_WORKER, 0), "");
  EXPECT_EQ(OutsideTheWorld(w, v1::ROLE_WORKER, 2), "");
  EXPECT_EQ(OutsideTheWorld(w, v1::ROLE_WORKER, 1),
            "worker 1 is outside the job's world (resized away); a grow starts it again");
}

// A view that says nothing (a scheduler without a world yet) and
// an agent not registered keep today's restarts.
TEST(OutsideTheWorldTest, AWorldThatSaysNothingRestartsAsBefore) {
  const v1::ClusterView empty;
  EXPECT_EQ(OutsideTheWorld(empty, v1::ROLE_SERVER, 5), "");
  EXPECT_EQ(OutsideTheWorld(empty, v1::ROLE_WORKER, 5), "");
  EXPECT_EQ(OutsideTheWorld(World({0}, 1), v1::ROLE_WORKER, -1), "");
  EXPECT_EQ(OutsideTheWorld(World({0}, 1), v1::ROLE_SERVER, -1), "");
}

}  // namespace
}  // namespace trellis
