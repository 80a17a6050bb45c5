// Elastic jobs on the worker (worker-lib/src/world_switch.h): what a worker does at its step
// boundaries while a resize is under way, against a scripted scheduler.
#include "worker-lib/src/world_switch.h"

#include <deque>

#include <gtest/gtest.h>

namespace trellis {
namespace {

using std::chrono::milliseconds;

struct FakeScheduler {
  int64_t epoch = 0;                             // what the pings say
  std::deque<v1::ReachStepResponse> answers;     // next answers to ReachStep
  std::vector<v1::ReachStepRequest> reports;     // what was asked
  std::vector<std::pair<int64_t, std::vector<int32_t>>> announced;
  Status announce_status;
  std::vector<std::string> events;        // "move 3 servers", "announce 1", in order
  Status move_status;
  bool can_move = true;

  WorldSwitch::Hooks Hooks() {
    return {[this] { return epoch; },
            [this](const v1::ReachStepRequest& r, milliseconds) -> StatusOr<v1::ReachStepResponse> {
              reports.push_back(r);
              if (answers.empty()) return v1::ReachStepResponse();
              auto a = answers.front();
              answers.pop_front();
              return a;
            },
            [this](int64_t e, const std::vector<int32_t>& m) {
              announced.push_back({e, m});
              events.push_back("announce " + std::to_string(e));
              return announce_status;
            },
            can_move ? std::function<Status(const v1::ShardMap&, const std::vector<std::string>&)>(
                           [this](const v1::ShardMap& map, const std::vector<std::string>& a) {
                             events.push_back("move " + std::to_string(map.num_servers()) +
                                              " servers at " + a.back());
                             return move_status;
                           })
                     : nullptr};
  }
};

v1::ReachStepResponse Decided(int64_t epoch, int64_t from, std::vector<int32_t> members) {
  v1::ReachStepResponse r;
  r.set_decided(true);
  r.mutable_world()->set_epoch(epoch);
  r.mutable_world()->set_from_step(from);
  for (int32_t m : members) r.mutable_world()->add_members(m);
  return r;
}

TEST(WorldSwitchTest, WithoutAResizeNothingIsAskedAndTheRankIsTheSlot) {
  FakeScheduler s;
  WorldSwitch w(1, 1, 3, v1::WorldInfo(), s.Hooks(), milliseconds(100));
  EXPECT_EQ(w.rank(), 1);
  EXPECT_EQ(w.size(), 3);
  for (int64_t step = 1; step <= 5; ++step) ASSERT_TRUE(w.AtBoundary(step).ok());
  EXPECT_TRUE(s.reports.empty());
  EXPECT_EQ(w.view().epoch, 0);
  EXPECT_FALSE(w.left());
}

// The first report does not wait; the next boundary waits for the decision; the switch comes at
// the boundary before the new world's first step: the servers are told, the rank is dense.
TEST(WorldSwitchTest, ReportsThenWaitsThenSwitchesAtTheBoundaryBeforeTheNewWorld) {
  FakeScheduler s;
  WorldSwitch w(2, 1, 3, v1::WorldInfo(), s.Hooks(), milliseconds(1000));
  s.epoch = 1;
  ASSERT_TRUE(w.AtBoundary(10).ok());
  ASSERT_EQ(s.reports.size(), 1u);
  EXPECT_FALSE(s.reports[0].wait());
  EXPECT_EQ(s.reports[0].step(), 10);
  EXPECT_EQ(s.reports[0].rank(), 2);
  EXPECT_EQ(s.reports[0].epoch(), 1);
  EXPECT_EQ(w.rank(), 2) << "nothing changes before the decision";

  // Another worker reported step 11: the new world starts at 13 (two after the furthest).
  s.answers.push_back(Decided(1, 13, {0, 2}));
  ASSERT_TRUE(w.AtBoundary(11).ok());
  ASSERT_EQ(s.reports.size(), 2u);
  EXPECT_TRUE(s.reports[1].wait()) << "the boundary after the report waits for the decision";
  EXPECT_TRUE(s.announced.empty()) << "step 12 is still the old world's";
  EXPECT_EQ(w.size(), 3);

  ASSERT_TRUE(w.AtBoundary(12).ok());
  EXPECT_EQ(s.reports.size(), 2u) << "decided: nothing more to ask";
  ASSERT_EQ(s.announced.size(), 1u);
  EXPECT_EQ(s.announced[0].first, 1);
  EXPECT_EQ(s.announced[0].second, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(w.rank(), 1);
  EXPECT_EQ(w.size(), 2);
  const WorldView v = w.view();
  EXPECT_EQ(v.epoch, 1);
  EXPECT_EQ(v.from_step, 13);
  EXPECT_FALSE(v.left);
  EXPECT_EQ(w.AtBoundary(14).code(), StatusCode::kOk);
}

// A worker inside a step when the pings announce the resize (it may be waiting for a peer that
// waits for the decision) reports from the pings' thread the last boundary it passed; its next
// boundary then waits for the decision. Before any boundary nothing is reported from there.
// A server resize is a world with the same members and another server count: at its boundary
// the worker moves the slices (with the decision's map and addresses) before it tells the
// servers the world; a failed move or a worker that cannot move is an error naming the resize.
TEST(WorldSwitchTest, AServerResizeMovesTheSlicesBeforeTheWorldIsAnnounced) {
  const auto decided = [](int64_t epoch, int64_t from) {
    v1::ReachStepResponse r = Decided(epoch, from, {0, 1});
    r.mutable_world()->set_servers(3);
    r.mutable_shard_map()->set_num_servers(3);
    r.mutable_shard_map()->set_world_epoch(epoch);
    for (const char* a : {"s0:1", "s1:1", "s2:1"}) r.add_server_addresses(a);
    return r;
  };
  {
    FakeScheduler s;
    WorldSwitch w(0, 1, 2, v1::WorldInfo(), s.Hooks(), milliseconds(1000));
    s.epoch = 1;
    s.answers.push_back(decided(1, 7));
    ASSERT_TRUE(w.AtBoundary(5).ok());
    EXPECT_TRUE(s.events.empty()) << "step 6 is still on the old servers";
    ASSERT_TRUE(w.AtBoundary(6).ok());
    EXPECT_EQ(s.events, (std::vector<std::string>{"move 3 servers at s2:1", "announce 1"}));
    EXPECT_EQ(w.view().epoch, 1);
    EXPECT_EQ(w.Info().servers(), 3);
  }
  {
    FakeScheduler s;
    s.move_status = UnavailableError("server 2 did not answer");
    WorldSwitch w(0, 1, 2, v1::WorldInfo(), s.Hooks(), milliseconds(1000));
    s.epoch = 1;
    s.answers.push_back(decided(1, 7));
    ASSERT_TRUE(w.AtBoundary(5).ok());
    Status st = w.AtBoundary(6);
    EXPECT_EQ(st.code(), StatusCode::kUnavailable);
    EXPECT_NE(st.message().find("resize to world 1 (3 servers): server 2 did not answer"),
              std::string::npos)
        << st.message();
    EXPECT_TRUE(s.announced.empty()) << "no world announced after a failed move";
  }
  {
    FakeScheduler s;
    s.can_move = false;
    WorldSwitch w(0, 1, 2, v1::WorldInfo(), s.Hooks(), milliseconds(1000));
    s.epoch = 1;
    s.answers.push_back(decided(1, 7));
    ASSERT_TRUE(w.AtBoundary(5).ok());
    EXPECT_EQ(w.AtBoundary(6).code(), StatusCode::kUnimplemented);
  }
}

TEST(WorldSwitchTest, ThePingsReportTheLastBoundaryOfAWorkerInsideAStep) {
  FakeScheduler s;
  WorldSwitch w(1, 1, 2, v1::WorldInfo(), s.Hooks(), milliseconds(1000));
  w.OnAnnounced(1);
  EXPECT_TRUE(s.reports.empty()) << "no boundary passed yet";
  ASSERT_TRUE(w.AtBoundary(5).ok());  // the pings have not said anything to the boundary
  ASSERT_EQ(s.reports.size(), 1u) << "the boundary reports once it follows the resize";
  EXPECT_FALSE(s.reports[0].wait());

  FakeScheduler t;
  WorldSwitch x(1, 1, 2, v1::WorldInfo(), t.Hooks(), milliseconds(1000));
  ASSERT_TRUE(x.AtBoundary(5).ok());  // no resize yet
  t.epoch = 1;
  x.OnAnnounced(1);  // from the pings' thread, the worker being inside step 6
  ASSERT_EQ(t.reports.size(), 1u);
  EXPECT_EQ(t.reports[0].step(), 5);
  EXPECT_FALSE(t.reports[0].wait());
  x.OnAnnounced(1);
  EXPECT_EQ(t.reports.size(), 1u) << "reported once";
  t.answers.push_back(Decided(1, 8, {0}));
  ASSERT_TRUE(x.AtBoundary(6).ok());
  ASSERT_EQ(t.reports.size(), 2u);
  EXPECT_TRUE(t.reports[1].wait()) << "the boundary after the report waits";
  EXPECT_FALSE(x.left());
  ASSERT_TRUE(x.AtBoundary(7).ok());
  EXPECT_TRUE(x.left());
}

// A boundary past the decided one means the worker pushed a step of the new world in the old
// one: an error, not a silent wrong sum.
TEST(WorldSwitchTest, ABoundaryPastTheSwitchIsAnError) {
  FakeScheduler s;
  WorldSwitch w(0, 1, 2, v1::WorldInfo(), s.Hooks(), milliseconds(1000));
  s.epoch = 1;
  s.answers.push_back(Decided(1, 5, {0}));
  ASSERT_TRUE(w.AtBoundary(3).ok());  // decided at the report: switch after step 4
  EXPECT_EQ(w.AtBoundary(6).code(), StatusCode::kInternal);
}

TEST(WorldSwitchTest, AWorkerLeftOutStopsAtTheBoundaryWithoutTellingTheServers) {
  FakeScheduler s;
  WorldSwitch w(1, 1, 2, v1::WorldInfo(), s.Hooks(), milliseconds(1000));
  s.epoch = 1;
  s.answers.push_back(Decided(1, 9, {0}));  // this report decides it: one more step, then leave
  ASSERT_TRUE(w.AtBoundary(7).ok());
  EXPECT_FALSE(w.left());
  ASSERT_TRUE(w.AtBoundary(8).ok());
  EXPECT_TRUE(s.announced.empty());
  EXPECT_TRUE(w.left());
  EXPECT_TRUE(w.view().left);
  EXPECT_NE(w.LeftMessage().find("worker 1 left the job at step 8"), std::string::npos)
      << w.LeftMessage();
  ASSERT_TRUE(w.AtBoundary(9).ok()) << "nothing more to do";
  EXPECT_EQ(s.reports.size(), 1u);
}

TEST(WorldSwitchTest, ADecisionNotReachedInTimeOrAFailedAnnouncementIsAnError) {
  FakeScheduler s;
  WorldSwitch w(0, 1, 2, v1::WorldInfo(), s.Hooks(), milliseconds(30));
  s.epoch = 1;
  ASSERT_TRUE(w.AtBoundary(3).ok());
  Status st = w.AtBoundary(4);  // waits, the scheduler never decides
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();

  FakeScheduler t;
  WorldSwitch x(0, 1, 2, v1::WorldInfo(), t.Hooks(), milliseconds(1000));
  t.epoch = 1;
  t.answers.push_back(Decided(1, 4, {0}));  // decided at this report: switch right here
  t.announce_status = UnavailableError("server 1 gone");
  st = x.AtBoundary(3);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("telling the servers"), std::string::npos) << st.message();
}

// A worker restarted after a resize starts in the world the scheduler's view says.
TEST(WorldSwitchTest, AWorkerStartsInTheWorldItIsGiven) {
  FakeScheduler s;
  v1::WorldInfo now;
  now.set_epoch(2);
  now.set_from_step(30);
  now.add_members(0);
  now.add_members(3);
  WorldSwitch w(3, 2, 4, now, s.Hooks(), milliseconds(100));
  EXPECT_EQ(w.rank(), 1);
  EXPECT_EQ(w.size(), 2);
  EXPECT_EQ(w.view().epoch, 2);
  s.epoch = 2;  // the resize this worker is already in: nothing to report
  ASSERT_TRUE(w.AtBoundary(31).ok());
  EXPECT_TRUE(s.reports.empty());
}

// Growing: a worker outside the world it starts in asks to join (step -1, waiting), takes the
// decided world (rank, size, operations allowed again) and tells the servers only when asked to
// (after it holds the members' commit); without a grow it stays out.
TEST(WorldSwitchTest, AJoinerAsksToJoinTakesTheDecidedWorldAndAnnouncesItLater) {
  v1::WorldInfo two;
  two.set_epoch(1);
  two.set_from_step(20);
  two.add_members(0);
  two.add_members(1);
  FakeScheduler s;
  s.answers.push_back(v1::ReachStepResponse());  // undecided: it asks again
  s.answers.push_back(Decided(2, 41, {0, 1, 2}));
  WorldSwitch w(2, 2, 3, two, s.Hooks(), milliseconds(1000));
  ASSERT_TRUE(w.left());
  ASSERT_TRUE(w.Join().ok());
  ASSERT_EQ(s.reports.size(), 2u);
  EXPECT_EQ(s.reports[0].epoch(), 2);
  EXPECT_EQ(s.reports[0].step(), -1);
  EXPECT_TRUE(s.reports[0].wait());
  EXPECT_FALSE(w.left());
  EXPECT_TRUE(w.LeftMessage().empty());
  EXPECT_EQ(w.rank(), 2);
  EXPECT_EQ(w.size(), 3);
  EXPECT_EQ(w.joined_from(), 41);
  EXPECT_TRUE(s.announced.empty()) << "not before it holds the model";
  ASSERT_TRUE(w.AnnounceJoined().ok());
  ASSERT_EQ(s.announced.size(), 1u);
  EXPECT_EQ(s.announced[0].first, 2);
  EXPECT_EQ(s.announced[0].second, (std::vector<int32_t>{0, 1, 2}));

  // No grow under way (the scheduler says FAILED_PRECONDITION): it stays out, no error.
  struct NoGrow : FakeScheduler {
    WorldSwitch::Hooks Hooks() {
      auto h = FakeScheduler::Hooks();
      h.reach_step = [](const v1::ReachStepRequest&, milliseconds) -> StatusOr<v1::ReachStepResponse> {
        return FailedPreconditionError("no resize to world 2 is under way");
      };
      return h;
    }
  } none;
  WorldSwitch out(2, 2, 3, two, none.Hooks(), milliseconds(100));
  ASSERT_TRUE(out.Join().ok());
  EXPECT_TRUE(out.left());
  EXPECT_EQ(out.joined_from(), 0);
  ASSERT_TRUE(out.AnnounceJoined().ok());
  EXPECT_TRUE(none.announced.empty());
}

}  // namespace
}  // namespace trellis
