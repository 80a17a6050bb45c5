// SchedulerWatch over real gRPC: a scheduler on a loopback port is shut down and another one
// started on the same port; the watch notices the new scheduler id and hands state back to it
// (here: registers a worker again with its previous rank, as an agent does), and callers waiting
// in WaitUp go on. The token is still checked by the restarted scheduler.
#include "scheduler/scheduler_watch.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "scheduler/scheduler_service.h"
#include "tests/testing/test_scheduler.h"

namespace trellis {
namespace {

using namespace std::chrono_literals;

SchedulerConfig Config() {
  SchedulerConfig c;
  c.job_name = "mlp";
  c.num_servers = 1;
  c.num_workers = 2;
  return c;
}

StatusOr<std::unique_ptr<SchedulerServer>> StartOn(int port) {
  SchedulerServerOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.service.token = "tok";
  o.sweep_interval = 10ms;
  return SchedulerServer::Start(Config(), std::move(o));
}

v1::RegisterRequest Reg(bool resume) {
  v1::RegisterRequest r;
  r.set_job("mlp");
  r.set_role(v1::ROLE_WORKER);
  r.set_pod_name("mlp-worker-1");
  r.set_host("127.0.0.1");
  if (resume) {
    r.set_previous_rank(1);
    r.set_previous_incarnation(1);
    r.set_resume(true);
  }
  return r;
}

// Worker 0's registration (pod mlp-worker-0; Reg() is worker 1's pod).
v1::RegisterRequest Worker0() {
  v1::RegisterRequest r = Reg(false);
  r.set_pod_name("mlp-worker-0");
  return r;
}

// What worker `rank`'s program of `incarnation` pings with: its identity.
v1::PingRequest WorkerProgram(int32_t rank, int64_t incarnation) {
  v1::PingRequest me;
  me.set_role(v1::ROLE_WORKER);
  me.set_rank(rank);
  me.set_incarnation(incarnation);
  return me;
}

// Worker `rank`'s first program was killed and its agent restarts it.
v1::ReportExitRequest KilledAndRestarted(int32_t rank) {
  v1::ReportExitRequest exit;
  exit.set_role(v1::ROLE_WORKER);
  exit.set_rank(rank);
  exit.set_incarnation(1);
  exit.set_exit_code(137);
  exit.set_will_restart(true);
  return exit;
}

// A scheduler with both workers registered (worker 0 first), and a client with the job's token.
struct TwoWorkers {
  std::unique_ptr<SchedulerServer> server;
  std::unique_ptr<SchedulerClient> client;
};
StatusOr<TwoWorkers> StartWithTwoWorkers() {
  TwoWorkers j;
  TRELLIS_ASSIGN_OR_RETURN(j.server, testing::StartTestScheduler(Config(), "tok"));
  TRELLIS_ASSIGN_OR_RETURN(j.client, SchedulerClient::Connect({j.server->address(), "tok", 2s}));
  TRELLIS_RETURN_IF_ERROR(j.client->Register(Worker0()).status());
  TRELLIS_RETURN_IF_ERROR(j.client->Register(Reg(false)).status());
  return j;
}

TEST(SchedulerWatchTest, ARestartedSchedulerOnTheSamePortGetsTheStateBack) {
  auto first = testing::StartTestScheduler(Config(), "tok");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const int port = (*first)->port();
  auto client = SchedulerClient::Connect({(*first)->address(), "tok", 2s});
  ASSERT_TRUE(client.ok());
  SchedulerClient& c = **client;
  ASSERT_TRUE(c.Register(Reg(false)).ok());
  auto ping = c.Ping();
  ASSERT_TRUE(ping.ok());
  EXPECT_EQ(ping->scheduler_id(), (*first)->state().instance_id());

  std::atomic<int> handed{0};
  SchedulerWatch watch(&c, ping->scheduler_id(), 100ms, [&] {
    ++handed;
    return c.Register(Reg(true)).status();
  }, "worker 1");
  EXPECT_TRUE(watch.WaitUp(5s));
  EXPECT_EQ(handed, 0) << "same scheduler: nothing to hand back";

  (*first)->Shutdown();
  first->reset();
  // A call now fails as if the scheduler were gone.
  EXPECT_EQ(c.Heartbeat(v1::ROLE_WORKER, 1, 1, "").status().code(), StatusCode::kUnavailable);

  auto second = StartOn(port);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  ASSERT_NE((*second)->state().instance_id(), ping->scheduler_id());
  ASSERT_TRUE(watch.WaitUp(10s)) << "the watch never found the restarted scheduler";
  EXPECT_EQ(handed, 1);
  EXPECT_EQ(watch.scheduler_id(), (*second)->state().instance_id());
  EXPECT_EQ(watch.restarts_seen(), 1);
  // The new scheduler knows worker 1 again, under its old rank and incarnation.
  const v1::ClusterView v = (*second)->state().GetCluster();
  EXPECT_EQ(v.workers(1).pod_name(), "mlp-worker-1");
  EXPECT_EQ(v.workers(1).incarnation(), 1);
  EXPECT_TRUE(v.recovering()) << "worker 0 and the server are not back yet";
  EXPECT_TRUE(c.Heartbeat(v1::ROLE_WORKER, 1, 1, "running").ok());

  // Still only with the job token.
  auto stranger = SchedulerClient::Connect({(*second)->address(), "wrong", 2s});
  ASSERT_TRUE(stranger.ok());
  EXPECT_EQ((*stranger)->Ping().status().code(), StatusCode::kUnauthenticated);
  v1::ResumeRequest resume;
  resume.set_rank(0);
  EXPECT_EQ((*stranger)->Resume(resume).status().code(), StatusCode::kUnauthenticated);
}

// The watch's pings name the process (its program's liveness, docs/scheduler.md#stalls), and
// their answers tell it which other members are being restarted, so its operations wait.
TEST(SchedulerWatchTest, PingsAreTheProgramsLivenessAndReportMembersBeingRestarted) {
  auto job = StartWithTwoWorkers();
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  SchedulerServer& server = *job->server;
  SchedulerClient& c = *job->client;
  SchedulerWatch watch(&c, 0, 50ms, nullptr, "worker 0", WorkerProgram(0, 1));
  EXPECT_EQ(watch.restarting_seen_at(), std::chrono::steady_clock::time_point());

  // Worker 1's program exits and its agent restarts it: being restarted until it pings.
  ASSERT_TRUE(c.ReportExit(KilledAndRestarted(1)).ok());
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (watch.restarting_seen().empty() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(watch.restarting_seen(), "worker 1");
  EXPECT_GT(watch.restarting_seen_at(), std::chrono::steady_clock::time_point());
  // Only worker 1 is being restarted, not the one whose program pings.
  auto view = server.state().GetCluster();
  EXPECT_FALSE(view.workers(0).restarting());
  EXPECT_TRUE(view.workers(1).restarting());
}

// The first ping goes out when the watch starts, not one interval later: a program that has never
// pinged is not judged for stalls, so one stopped before its first ping went undetected (its
// peers hit their deadlines instead of waiting). Here the interval is an hour: a restarted
// worker's new program must still count as back at once.
TEST(SchedulerWatchTest, TheFirstPingGoesOutAtOnce) {
  auto job = StartWithTwoWorkers();
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  SchedulerServer& server = *job->server;
  SchedulerClient& c = *job->client;
  ASSERT_TRUE(c.ReportExit(KilledAndRestarted(0)).ok());
  auto again = c.Register(Worker0());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_EQ(again->rank(), 0);
  ASSERT_TRUE(server.state().GetCluster().workers(0).restarting());

  SchedulerWatch watch(&c, 0, std::chrono::hours(1), nullptr, "worker 0",
                       WorkerProgram(0, again->incarnation()));
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (server.state().GetCluster().workers(0).restarting() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_FALSE(server.state().GetCluster().workers(0).restarting())
      << "the new program's watch had not pinged within 10 s";
}

// A worker's watch learns from its pings that the whole job is being stopped (StopJob), which
// rank 0's checkpointer reads at every step boundary (docs/checkpoints.md#stopping-a-job-the-exit-checkpoint).
TEST(SchedulerWatchTest, ThePingsSayWhenTheJobIsBeingStopped) {
  auto server = StartOn(0);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  SchedulerClientOptions o;
  o.address = (*server)->address();
  o.token = "tok";
  auto c = SchedulerClient::Connect(o);
  ASSERT_TRUE(c.ok());
  SchedulerWatch watch(c->get(), 0, 20ms, nullptr, "worker 0");
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(watch.job_stopping());
  ASSERT_TRUE((*c)->StopJob("test").ok());
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (!watch.job_stopping() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(watch.job_stopping()) << "no ping within 10 s said the job is stopping";
  (*server)->Shutdown();
}

// A listener runs on the watch's thread. A call it makes that fails as if the scheduler were gone
// waits in WaitUp for a ping that only that thread would send: WaitUp must not wait there. (A
// worker's resize report, made while its agent had not registered again with a restarted
// scheduler, stalled every thread of the worker for 60 s: ElasticServersTest, once, under load.)
TEST(SchedulerWatchTest, WaitUpFromAListenerOnTheWatchsOwnThreadDoesNotWaitForItself) {
  SchedulerConfig config = Config();
  config.elastic = ElasticBounds{true, 1, 2};
  auto server = testing::StartTestScheduler(config, "tok");
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto c = SchedulerClient::Connect({(*server)->address(), "tok", 2s});
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Register(Worker0()).ok());
  ASSERT_TRUE((*c)->Register(Reg(false)).ok());
  ASSERT_TRUE((*c)->Resize(1, "test").ok());  // a resize under way: every ping says so

  std::atomic<int> calls{0};
  std::atomic<bool> said_up{true};
  SchedulerWatch watch(c->get(), 0, 20ms, nullptr, "worker 0");
  watch.SetResizeListener([&](int64_t) {
    if (calls.load() == 0) said_up = watch.WaitUp(std::chrono::hours(1));
    ++calls;
  });
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (calls.load() < 2 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(10ms);
  EXPECT_GE(calls.load(), 2) << "the listener's WaitUp held the watch's thread";
  EXPECT_FALSE(said_up.load());
}

TEST(SchedulerWatchTest, GoneOrRestartedMeansUnavailableOrNotFound) {
  EXPECT_TRUE(SchedulerGoneOrRestarted(UnavailableError("x")));
  EXPECT_TRUE(SchedulerGoneOrRestarted(NotFoundError("worker 1 has not registered")));
  EXPECT_FALSE(SchedulerGoneOrRestarted(DeadlineExceededError("x")));
  EXPECT_FALSE(SchedulerGoneOrRestarted(FailedPreconditionError("x")));
}

}  // namespace
}  // namespace trellis
