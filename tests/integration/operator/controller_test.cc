// The whole control loop (watches, queue, reconcile thread) against the API double, and the
// trellis-operator binary's /healthz and /metrics.
#include <map>
#include <thread>

#include <gtest/gtest.h>

#include <cpprest/http_client.h>

#include "common/config/env.h"
#include "common/base/net.h"

#include "operator/controller.h"
#include "operator/object_cache.h"
#include "operator/operator_metrics.h"
#include "operator/reconciler.h"
#include "tests/integration/operator/double_fixture.h"

namespace trellis::op::testing {
namespace {

using std::chrono::seconds;

constexpr char kSpec[] = R"({"workers":{"replicas":2,"command":["w"]}})";

class ControllerTest : public DoubleTest {};

TEST_F(ControllerTest, WatchDrivesReconcileAndSurvivesBrokenAndExpiredWatches) {
  Reconciler reconciler(*client_, OperatorSettings{}, [] { return Clock::now(); });
  ControllerOptions opts;
  opts.backoff_initial = std::chrono::milliseconds(20);
  opts.backoff_max = std::chrono::milliseconds(100);
  Controller controller(*client_, reconciler, opts);
  controller.Start();
  ASSERT_TRUE(WaitFor([&] { return controller.synced(); }, seconds(10)));

  CreateJob("one", kSpec);
  ASSERT_TRUE(WaitFor([&] { return PodNames("one").size() == 4; }, seconds(10)));
  // A pod event (the kubelet's status) reaches the job through the pod watch.
  SetAllPodsPhase("one", "Running");
  ASSERT_TRUE(WaitFor([&] { return Str(GetJob("one"), {"status", "phase"}) == "Running"; }, seconds(10)));

  // The connection drops: the watch resumes from its resourceVersion.
  const uint64_t restarts = controller.counters().watch_restarts.load();
  Hook("break-watches");
  CreateJob("two", kSpec);
  ASSERT_TRUE(WaitFor([&] { return PodNames("two").size() == 4; }, seconds(10)));
  EXPECT_GT(controller.counters().watch_restarts.load(), restarts);

  // The API server can no longer serve the watches' version: 410 Gone in the stream, relist.
  const uint64_t relists = controller.counters().relists.load();
  Hook("expire-watches");
  CreateJob("three", kSpec);
  ASSERT_TRUE(WaitFor([&] { return PodNames("three").size() == 4; }, seconds(10)));
  ASSERT_TRUE(WaitFor([&] { return controller.counters().relists.load() >= relists + 2; }, seconds(10)));

  SetPodPhase("one-worker-0", "Succeeded", 0);
  SetPodPhase("one-worker-1", "Succeeded", 0);
  ASSERT_TRUE(WaitFor([&] { return Str(GetJob("one"), {"status", "phase"}) == "Succeeded"; }, seconds(10)));
  controller.Stop();
  Json created = Stats().at("created").at("Pod");
  EXPECT_EQ(created.size(), 12u) << created.serialize();  // 3 jobs x 4 pods, none twice
}

TEST_F(ControllerTest, OperatorRestartedMidJobRelistsAndCreatesNoDuplicates) {
  auto run_operator = [&](const std::function<void()>& body) {
    Reconciler reconciler(*client_, OperatorSettings{}, [] { return Clock::now(); });
    Controller controller(*client_, reconciler, ControllerOptions{});
    controller.Start();
    ASSERT_TRUE(WaitFor([&] { return controller.synced(); }, seconds(10)));
    body();
    controller.Stop();
  };
  CreateJob("job", kSpec);
  run_operator([&] { ASSERT_TRUE(WaitFor([&] { return PodNames("job").size() == 4; }, seconds(10))); });
  SetAllPodsPhase("job", "Running");  // while no operator runs
  run_operator([&] {
    ASSERT_TRUE(WaitFor([&] { return Str(GetJob("job"), {"status", "phase"}) == "Running"; }, seconds(10)));
    SetPodPhase("job-worker-0", "Succeeded", 0);
    SetPodPhase("job-worker-1", "Succeeded", 0);
    ASSERT_TRUE(WaitFor([&] { return Str(GetJob("job"), {"status", "phase"}) == "Succeeded"; }, seconds(10)));
  });
  Json created = Stats().at("created").at("Pod");
  EXPECT_EQ(created.size(), 4u) << created.serialize();
}

TEST_F(ControllerTest, FailingApiCallsAreRetriedWithBackOffUntilTheyWork) {
  Hook("fail?method=POST&path=/api/v1/namespaces/default/pods&count=3");
  Reconciler reconciler(*client_, OperatorSettings{}, [] { return Clock::now(); });
  ControllerOptions opts;
  opts.backoff_initial = std::chrono::milliseconds(20);
  opts.backoff_max = std::chrono::milliseconds(200);
  Controller controller(*client_, reconciler, opts);
  controller.Start();
  CreateJob("flaky", kSpec);
  ASSERT_TRUE(WaitFor([&] { return PodNames("flaky").size() == 4; }, seconds(10)));
  EXPECT_EQ(controller.counters().reconcile_errors.load(), 3u);
  EXPECT_GE(client_->api_errors(), 3u);  // the injected 500s, counted for /metrics
  controller.Stop();
}

// With the cache the binary uses (operator/object_cache.h): a resync reconciles every job from the
// cache and makes no request while nothing changes; a change still reaches the job, and an owned
// object deleted by someone comes back from its watch event.
TEST_F(ControllerTest, WithACacheAnIdleOperatorMakesNoRequestButItsWatches) {
  ObjectCache cache;
  Reconciler reconciler(*client_, OperatorSettings{}, [] { return Clock::now(); }, {}, &cache);
  ControllerOptions opts;
  opts.resync = std::chrono::milliseconds(100);
  Controller controller(*client_, reconciler, opts, {}, &cache);
  controller.Start();
  ASSERT_TRUE(WaitFor([&] { return controller.synced(); }, seconds(10)));
  for (const char* name : {"a", "b", "c"}) CreateJob(name, kSpec);
  ASSERT_TRUE(WaitFor([&] { return PodNames("a").size() == 4 && PodNames("b").size() == 4 && PodNames("c").size() == 4; },
                      seconds(10)));
  SetAllPodsPhase("b", "Running");
  ASSERT_TRUE(WaitFor([&] { return Str(GetJob("b"), {"status", "phase"}) == "Running"; }, seconds(10)));
  // Requests other than the watches' own, over 0.6 s (six resyncs); the first windows may still
  // hold the echoes of the creation.
  auto requests = [&] {
    std::map<std::string, int64_t> out;
    const Json stats = Stats();
    const Json* r = At(stats, {"requests"});
    if (r && r->is_object()) {
      for (const auto& [k, v] : r->as_object()) {
        if (k.rfind("WATCH ", 0) != 0) out[k] = v.as_number().to_int64();
      }
    }
    return out;
  };
  std::map<std::string, int64_t> before, after;
  const uint64_t reconciles0 = controller.counters().reconciles.load();
  ASSERT_TRUE(WaitFor(
      [&] {
        before = requests();
        std::this_thread::sleep_for(std::chrono::milliseconds(600));
        after = requests();
        return before == after;
      },
      seconds(20)))
      << "requests while idle keep coming";
  EXPECT_GE(controller.counters().reconciles.load(), reconciles0 + 3 * 5);  // the resyncs did run
  EXPECT_GE(cache.pods.size(), 12u);
  // The client counts its requests by verb as the API server does (trellis_operator_api_requests_total).
  const auto counts = client_->RequestCounts();
  EXPECT_GE(counts.count({"WATCH", "pods"}) ? counts.at({"WATCH", "pods"}) : 0, 1u);
  EXPECT_GE(counts.count({"PUT", "trainingjobs/status"}) ? counts.at({"PUT", "trainingjobs/status"}) : 0, 3u);

  // A change reaches the job from the pod watch, through the cache.
  SetPodPhase("b-worker-0", "Succeeded", 0);
  SetPodPhase("b-worker-1", "Succeeded", 0);
  ASSERT_TRUE(WaitFor([&] { return Str(GetJob("b"), {"status", "phase"}) == "Succeeded"; }, seconds(10)));
  // An owned object deleted from outside is created again.
  ASSERT_TRUE(client_->Delete(kServices, "default", "a-scheduler").ok());
  ASSERT_TRUE(WaitFor([&] { return client_->Get(kServices, "default", "a-scheduler").ok(); }, seconds(10)));
  controller.Stop();
  Json created = Stats().at("created").at("Pod");
  EXPECT_EQ(created.size(), 12u) << created.serialize();  // 3 jobs x 4 pods, none twice
}

// A real API server sends bookmarks rarely: stopping must not wait for the next line of a watch.
class QuietWatchTest : public DoubleTest {
 protected:
  std::vector<std::string> DoubleArgs() override { return {"--bookmark-seconds", "3600"}; }
};

TEST_F(QuietWatchTest, StopInterruptsIdleWatchesAtOnce) {
  Reconciler reconciler(*client_, OperatorSettings{}, [] { return Clock::now(); });
  Controller controller(*client_, reconciler, ControllerOptions{});
  controller.Start();
  ASSERT_TRUE(WaitFor([&] { return Int(Stats(), {"openWatches"}) == 2; }, seconds(10)));  // both idle
  const auto t0 = std::chrono::steady_clock::now();
  controller.Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, seconds(3));
}

TEST_F(ControllerTest, BinaryServesHealthzAndMetricsAndReconciles) {
  auto port = PickFreePort("127.0.0.1");
  ASSERT_TRUE(port.ok());
  SpawnOptions o;
  o.argv = {std::string(TRELLIS_BIN_DIR) + "/trellis-operator", "--server", server_, "--metrics-host", "127.0.0.1",
            "--metrics-port", std::to_string(*port), "--leader-elect", "true"};
  o.env = CurrentEnvironment();
  o.stdout_mode = SpawnOptions::Output::kFile;
  o.stdout_path = dir_ + "/operator.log";
  o.stderr_mode = SpawnOptions::Output::kStdout;
  auto op = Subprocess::Start(o);
  ASSERT_TRUE(op.ok()) << op.status().message();
  web::http::client::http_client http("http://127.0.0.1:" + std::to_string(*port));
  auto get = [&](const std::string& path) -> std::pair<int, std::string> {
    try {
      auto r = http.request(web::http::methods::GET, path).get();
      return {r.status_code(), r.extract_string(true).get()};
    } catch (const std::exception&) {
      return {0, ""};
    }
  };
  ASSERT_TRUE(WaitFor([&] { return get("/healthz").first == 200; }, seconds(20)));
  CreateJob("bad", R"({"workers":{"command":[]}})");
  ASSERT_TRUE(WaitFor([&] { return Str(GetJob("bad"), {"status", "phase"}) == "Failed"; }, seconds(10)));
  EXPECT_EQ(Condition(GetJob("bad"), "Failed", "message"),
            "spec.workers.command: must not be empty, got an empty sequence");
  // The gauge follows the status write (after the reconcile returns): wait for it.
  std::string body;
  EXPECT_TRUE(WaitFor(
      [&] {
        auto [code, text] = get("/metrics");
        body = text;
        return code == 200 && text.find("trellis_operator_jobs{role=\"operator\",phase=\"Failed\"} 1") != std::string::npos;
      },
      seconds(10)))
      << body;
  EXPECT_NE(body.find("trellis_operator_reconciles_total"), std::string::npos);
  EXPECT_NE(body.find("trellis_operator_reconcile_duration_seconds_bucket"), std::string::npos);
  // It reconciled as the leader: the Lease names it.
  auto lease = client_->Get(kLeases, "default", "trellis-operator");
  ASSERT_TRUE(lease.ok()) << lease.status().message();
  EXPECT_FALSE(Str(*lease, {"spec", "holderIdentity"}).empty());
  ASSERT_TRUE((*op)->Signal(SIGTERM).ok());
  auto exit = (*op)->WaitFor(std::chrono::seconds(10));
  ASSERT_TRUE(exit.has_value()) << "the operator did not stop on SIGTERM";
  EXPECT_EQ(exit->exit_code, 0);
}

TEST(OperatorMetricsTest, JobsByPhaseCountsEachJobsCurrentPhaseOnce) {
  MetricsRegistry registry(MetricLabels{"", "operator", -1});
  OperatorMetrics m(registry);
  auto text = [&] { return registry.Serialize(); };
  m.SetJobPhase("ns/a", "Pending");
  m.SetJobPhase("ns/b", "Pending");
  m.SetJobPhase("ns/a", "Running");
  m.SetJobPhase("ns/a", "Running");  // reconciled again: still one job
  EXPECT_NE(text().find("trellis_operator_jobs{role=\"operator\",phase=\"Pending\"} 1"), std::string::npos) << text();
  EXPECT_NE(text().find("trellis_operator_jobs{role=\"operator\",phase=\"Running\"} 1"), std::string::npos) << text();
  m.SetJobPhase("ns/b", "");  // deleted
  EXPECT_NE(text().find("trellis_operator_jobs{role=\"operator\",phase=\"Pending\"} 0"), std::string::npos) << text();
  m.SetApiErrors(3);
  m.SetApiErrors(5);
  EXPECT_NE(text().find("trellis_operator_api_errors_total{role=\"operator\"} 5"), std::string::npos) << text();
  m.SetApiRequests({{{"WATCH", "pods"}, 2}, {{"PUT", "trainingjobs/status"}, 1}});
  m.SetApiRequests({{{"WATCH", "pods"}, 3}, {{"PUT", "trainingjobs/status"}, 1}});
  EXPECT_NE(text().find("trellis_operator_api_requests_total{role=\"operator\",resource=\"pods\",verb=\"WATCH\"} 3"),
            std::string::npos)
      << text();
  EXPECT_NE(text().find("resource=\"trainingjobs/status\",verb=\"PUT\"} 1"), std::string::npos) << text();
}

TEST(OperatorBinaryTest, BadFlagsAndNoClusterGiveClearErrors) {
  auto run = [](std::vector<std::string> args) {
    SpawnOptions o;
    o.argv = {std::string(TRELLIS_BIN_DIR) + "/trellis-operator"};
    o.argv.insert(o.argv.end(), args.begin(), args.end());
    auto env = CurrentEnvironment();
    env.erase("KUBERNETES_SERVICE_HOST");
    o.env = env;
    o.stdout_mode = SpawnOptions::Output::kNull;
    o.stderr_mode = SpawnOptions::Output::kNull;
    auto p = Subprocess::Start(o);
    EXPECT_TRUE(p.ok());
    return p.ok() ? (*p)->WaitFor(std::chrono::seconds(10)).value_or(ExitStatus{-1, 0}).exit_code : -1;
  };
  EXPECT_EQ(run({"--metrics-port", "http"}), 2);
  EXPECT_EQ(run({"--bogus", "1"}), 2);
  EXPECT_EQ(run({"--server", "http://127.0.0.1:1", "--leader-elect", "yes"}), 2);
  EXPECT_EQ(run({}), 2);  // not in a cluster and no --server
}

}  // namespace
}  // namespace trellis::op::testing
