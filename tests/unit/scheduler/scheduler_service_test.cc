// The gRPC service in-process on 127.0.0.1:0, through the real client library.
#include "scheduler/scheduler_service.h"

#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <thread>

#include "common/tls/auth.h"
#include "scheduler/scheduler_client.h"

namespace trellis {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

class SchedulerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SchedulerConfig config;
    config.job_name = "mlp";
    config.num_servers = 1;
    config.num_workers = 3;
    config.slice_bytes = 64;
    SchedulerServerOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    options.service.token = "s3cret";
    options.service.job_yaml = "kind: TrainingJob\n";
    options.sweep_interval = 10ms;
    auto server = SchedulerServer::Start(config, options);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
    ASSERT_GT(server_->port(), 0);
    client_ = Client("s3cret");
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }
  std::unique_ptr<SchedulerClient> Client(const std::string& token) {
    SchedulerClientOptions o;
    o.address = server_->address();
    o.token = token;
    o.rpc_timeout = 5s;
    auto c = SchedulerClient::Connect(o);
    EXPECT_TRUE(c.ok());
    return std::move(c).value();
  }
  StatusOr<v1::RegisterResponse> Reg(SchedulerClient& c, v1::Role role, const std::string& pod) {
    v1::RegisterRequest r;
    r.set_job("mlp");
    r.set_role(role);
    r.set_pod_name(pod);
    r.set_host("127.0.0.1");
    return c.Register(r);
  }
  void Boot() {
    ASSERT_TRUE(Reg(*client_, v1::ROLE_SERVER, "mlp-server-0").ok());
    ASSERT_TRUE(client_->ReportReady(v1::ROLE_SERVER, 0, "127.0.0.1:7000").ok());
    for (int i = 0; i < 3; ++i) {
      auto r = Reg(*client_, v1::ROLE_WORKER, "mlp-worker-" + std::to_string(i));
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      ASSERT_EQ(r->rank(), i);
    }
  }

  std::unique_ptr<SchedulerServer> server_;
  std::unique_ptr<SchedulerClient> client_;
};

v1::KeySpec Key(uint64_t id, int64_t n) {
  v1::KeySpec k;
  k.set_id(id);
  k.set_name("k" + std::to_string(id));
  k.set_num_elements(n);
  k.set_dtype(v1::DTYPE_FLOAT32);
  return k;
}

TEST_F(SchedulerServiceTest, RegisterClusterKeysBarrier) {
  auto job = client_->GetJobYaml();
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(*job, "kind: TrainingJob\n");
  Boot();
  auto view = client_->GetCluster(0, true, 5s);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_TRUE(view->complete());
  EXPECT_EQ(view->servers(0).address(), "127.0.0.1:7000");
  EXPECT_EQ(view->workers(2).pod_name(), "mlp-worker-2");

  // Three workers declare from three threads (own channels); all get the same map.
  std::vector<v1::KeySpec> keys = {Key(2, 100), Key(1, 16), Key(3, 1)};
  std::vector<StatusOr<v1::ShardMap>> maps(3, StatusOr<v1::ShardMap>(Status(StatusCode::kUnknown, "not run")));
  std::vector<Status> barriers(3);
  std::vector<std::thread> threads;
  for (int w = 0; w < 3; ++w) {
    threads.emplace_back([&, w] {
      auto c = Client("s3cret");
      maps[static_cast<size_t>(w)] = c->DeclareKeys(w, keys, 10s);
      barriers[static_cast<size_t>(w)] = c->Barrier("after-keys", v1::ROLE_WORKER, w, 0, false, 10s);
    });
  }
  for (auto& t : threads) t.join();
  for (int w = 0; w < 3; ++w) {
    ASSERT_TRUE(maps[static_cast<size_t>(w)].ok()) << maps[static_cast<size_t>(w)].status().ToString();
    EXPECT_EQ(maps[static_cast<size_t>(w)]->SerializeAsString(), maps[0]->SerializeAsString());
    EXPECT_TRUE(barriers[static_cast<size_t>(w)].ok()) << barriers[static_cast<size_t>(w)].ToString();
  }
  ASSERT_EQ(maps[0]->keys_size(), 3);
  EXPECT_EQ(maps[0]->keys(0).key().id(), 1u);
  EXPECT_EQ(maps[0]->keys(1).slices_size(), 7);  // 100 floats in 16-float slices
  EXPECT_EQ(maps[0]->slice_bytes(), 64);

  // Heartbeats and exits travel too.
  auto hb = client_->Heartbeat(v1::ROLE_WORKER, 0, 1, "step 1");
  ASSERT_TRUE(hb.ok());
  EXPECT_FALSE(hb->job_failed());
  v1::ReportExitRequest exit;
  exit.set_role(v1::ROLE_WORKER);
  exit.set_rank(2);
  exit.set_exit_code(0);
  EXPECT_TRUE(client_->ReportExit(exit).ok());
  EXPECT_TRUE(client_->Leave(v1::ROLE_WORKER, 2).ok());
}

TEST_F(SchedulerServiceTest, KeyMismatchReachesEveryWorker) {
  Boot();
  // Workers 0 and 1 send identical bytes (the second takes the no-parse path); worker 2 differs.
  std::vector<v1::KeySpec> keys = {Key(1, 16), Key(2, 100)};
  std::vector<v1::KeySpec> other = {Key(1, 16), Key(2, 99)};
  std::vector<Status> got(3);
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      got[static_cast<size_t>(w)] = Client("s3cret")->DeclareKeys(w, keys, 10s).status();
    });
  }
  // Worker 2 declares once both others are parked in the state.
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (server_->state().stats().waiters < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  got[2] = client_->DeclareKeys(2, other, 10s).status();
  for (auto& t : threads) t.join();
  for (const auto& st : got) {
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(st.message(), HasSubstr("key mismatch: worker 0 declares key 2 \"k2\" (100 x "
                                        "float32), worker 2 declares (99 x float32)"));
  }
}

TEST_F(SchedulerServiceTest, WrongOrMissingTokenIsUnauthenticated) {
  auto wrong = Client("nope");
  auto r = Reg(*wrong, v1::ROLE_WORKER, "intruder");
  EXPECT_EQ(r.status().code(), StatusCode::kUnauthenticated);
  EXPECT_THAT(r.status().message(), HasSubstr("wrong job token"));
  auto none = Client("");
  EXPECT_EQ(none->GetJobYaml().status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(none->Barrier("b", v1::ROLE_WORKER, 0, 0, false, 1s).code(),
            StatusCode::kUnauthenticated);
  // Nothing was registered by the intruder.
  EXPECT_EQ(server_->state().stats().registrations, 0);
}

TEST_F(SchedulerServiceTest, BadRequestsAreInvalidArgumentAndTheServerKeepsServing) {
  EXPECT_EQ(Reg(*client_, v1::ROLE_UNSPECIFIED, "p").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Reg(*client_, v1::ROLE_WORKER, "").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->ReportReady(v1::ROLE_SERVER, 99, "h:1").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Heartbeat(static_cast<v1::Role>(42), 0, 1, "").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->DeclareKeys(-1, {Key(1, 1)}, 1s).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Barrier("", v1::ROLE_WORKER, 0, 0, false, 1s).code(),
            StatusCode::kInvalidArgument);
  // Raw garbage bytes as a request: the call fails, the server stays up.
  {
    auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    grpc::GenericStub generic(channel);
    grpc::ClientContext ctx;
    ctx.AddMetadata(kTokenMetadataKey, "s3cret");
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    const char garbage[] = "\xff\xff\xff\xff\x0f garbage";
    grpc::Slice slice(garbage, sizeof(garbage));
    grpc::ByteBuffer req(&slice, 1), resp;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    grpc::Status st;
    generic.UnaryCall(&ctx, "/trellis.v1.Scheduler/Register", grpc::StubOptions(), &req, &resp,
                      [&](grpc::Status s) {
                        std::lock_guard<std::mutex> lock(mu);
                        st = s;
                        done = true;
                        cv.notify_all();
                      });
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return done; }));
    EXPECT_FALSE(st.ok());
  }
  Boot();
  auto view = client_->GetCluster(0, true, 5s);
  ASSERT_TRUE(view.ok());
  EXPECT_TRUE(view->complete());
}

TEST_F(SchedulerServiceTest, LongPollAnswersBeforeTheClientDeadline) {
  ASSERT_TRUE(Reg(*client_, v1::ROLE_WORKER, "w0").ok());
  auto start = std::chrono::steady_clock::now();
  auto view = client_->GetCluster(0, true, 600ms);  // never completes
  auto took = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_FALSE(view->complete());
  EXPECT_GE(took, 400ms);
  // A waiting barrier times out with a message naming the missing workers.
  Status b = client_->Barrier("b", v1::ROLE_WORKER, 0, 0, false, 500ms);
  EXPECT_EQ(b.code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(b.message(), HasSubstr("waiting for worker 1, worker 2"));
}

TEST_F(SchedulerServiceTest, ShutdownReleasesWaitingCalls) {
  Boot();
  Status result;
  std::thread waiter([&] { result = client_->Barrier("b", v1::ROLE_WORKER, 0, 0, false, 30s); });
  // Wait until the barrier call is parked in the state (no sleeps as synchronisation).
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (server_->state().stats().waiters == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  ASSERT_EQ(server_->state().stats().waiters, 1);
  auto start = std::chrono::steady_clock::now();
  server_->Shutdown();
  waiter.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_EQ(result.code(), StatusCode::kUnavailable);
}

// Stopping the whole job from outside (docs/checkpoints.md#stopping-a-job-the-exit-checkpoint): StopJob turns every
// ping's `stopping` on and shows in GetProgress; rank 0's checkpoint reports make the job's
// newest checkpoint (an older one reported late does not replace it); bad reports and callers
// without the token change nothing.
TEST_F(SchedulerServiceTest, StopJobReachesThePingsAndCheckpointReportsReachTheProgress) {
  Boot();
  EXPECT_FALSE(client_->Ping()->stopping());
  EXPECT_FALSE(client_->GetProgress()->has_checkpoint());
  EXPECT_FALSE(client_->GetProgress()->exit_ready());
  EXPECT_FALSE(client_->GetProgress()->has_resumed_from());

  // Rank 0's checkpointer starts: it will write an exit checkpoint, and it resumed from step 16.
  v1::ReportCheckpointRequest ready;
  ready.set_exit_ready(true);
  ASSERT_TRUE(client_->ReportCheckpoint(ready).ok());
  EXPECT_TRUE(client_->GetProgress()->exit_ready());
  EXPECT_FALSE(client_->GetProgress()->has_checkpoint()) << "no checkpoint in a readiness report";
  v1::ReportCheckpointRequest restored;
  restored.set_step(16);
  restored.set_path("/ckpt/model-000000000016.ckpt");
  restored.set_restored(true);
  restored.set_exit_ready(true);
  ASSERT_TRUE(client_->ReportCheckpoint(restored).ok());
  EXPECT_EQ(client_->GetProgress()->resumed_from().step(), 16);
  EXPECT_EQ(client_->GetProgress()->resumed_from().path(), "/ckpt/model-000000000016.ckpt");
  EXPECT_EQ(client_->GetProgress()->checkpoint().step(), 16) << "the newest checkpoint, too";
  restored.set_on_exit(true);  // both at once: refused
  EXPECT_EQ(client_->ReportCheckpoint(restored).code(), StatusCode::kInvalidArgument);

  v1::ReportCheckpointRequest ck;
  ck.set_step(64);
  ck.set_path("/ckpt/model-000000000064.ckpt");
  ASSERT_TRUE(client_->ReportCheckpoint(ck).ok());
  ck.set_step(32);  // late
  ck.set_path("/ckpt/model-000000000032.ckpt");
  ASSERT_TRUE(client_->ReportCheckpoint(ck).ok());
  auto p = client_->GetProgress();
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->checkpoint().step(), 64);
  EXPECT_EQ(p->checkpoint().path(), "/ckpt/model-000000000064.ckpt");
  EXPECT_FALSE(p->checkpoint().on_exit());
  EXPECT_GT(p->checkpoint().unix_ms(), 1'700'000'000'000);  // wall-clock milliseconds

  for (auto [step, path] : {std::pair<int64_t, std::string>{0, "/a"}, {-5, "/a"}, {70, ""},
                            {70, std::string(5000, 'p')}}) {
    v1::ReportCheckpointRequest bad;
    bad.set_step(step);
    bad.set_path(path);
    EXPECT_EQ(client_->ReportCheckpoint(bad).code(), StatusCode::kInvalidArgument) << step;
  }
  auto wrong = Client("nope");
  EXPECT_EQ(wrong->StopJob("x").code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(wrong->ReportCheckpoint(ck).code(), StatusCode::kUnauthenticated);
  EXPECT_FALSE(client_->Ping()->stopping());
  EXPECT_EQ(client_->GetProgress()->checkpoint().step(), 64);

  ASSERT_TRUE(client_->StopJob("trellis-launch got SIGTERM").ok());
  ASSERT_TRUE(client_->StopJob("a second reason").ok());  // idempotent, the first reason stays
  EXPECT_TRUE(client_->Ping()->stopping());
  p = client_->GetProgress();
  EXPECT_TRUE(p->stopping());
  EXPECT_EQ(p->stop_reason(), "trellis-launch got SIGTERM");
  ck.set_step(71);
  ck.set_path("/ckpt/model-000000000071.ckpt");
  ck.set_on_exit(true);
  ASSERT_TRUE(client_->ReportCheckpoint(ck).ok());
  EXPECT_EQ(client_->GetProgress()->checkpoint().step(), 71);
  EXPECT_TRUE(client_->GetProgress()->checkpoint().on_exit());
  EXPECT_EQ(client_->GetProgress()->resumed_from().step(), 16) << "where it resumed stays";
}

TEST(SchedulerServer, RejectsBadConfig) {
  SchedulerConfig config;
  config.num_workers = 0;
  auto s = SchedulerServer::Start(config, SchedulerServerOptions());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("number of workers must be >= 1, got 0"));
}

}  // namespace
}  // namespace trellis
