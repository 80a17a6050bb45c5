// bench_scheduler: how long 1000 agents take to register, see the complete cluster and get the
// shard map of 10,000 keys, against an in-process SchedulerServer over real gRPC on loopback.
//
// All calls of a phase are in flight at once (callback client API over a few channels), as
// 1000 pods would be. Request bytes are built before the clock starts (each worker serializes
// its own declaration on its own machine); the timed part is the scheduler's work plus the
// loopback transport. The same run measures a baseline: 1000 bare unary calls (GetJob) issued
// the same way. Bounded: every phase waits at most --timeout seconds, then the bench fails.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "common/tls/auth.h"
#include "common/base/logging.h"
#include "scheduler/scheduler_service.h"

namespace trellis {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int servers = 100;
  int workers = 900;
  int keys = 10000;
  int channels = 4;
  uint64_t seed = 1;
  int64_t slice_bytes = 4 << 20;
  std::string dispatch = "roundRobin";
  int timeout_s = 60;
};

// Counts finished calls; Wait gives up at the deadline.
class Latch {
 public:
  void Add(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ += n;
  }
  void Done(const grpc::Status& st) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!st.ok() && first_error_.ok()) first_error_ = st;
    if (--pending_ == 0) cv_.notify_all();
  }
  bool Wait(std::chrono::seconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [this] { return pending_ == 0; });
  }
  grpc::Status first_error() {
    std::lock_guard<std::mutex> lock(mu_);
    return first_error_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int pending_ = 0;                 // GUARDED_BY(mu_)
  grpc::Status first_error_;        // GUARDED_BY(mu_)
};

template <typename Req, typename Resp>
struct Call {
  grpc::ClientContext ctx;
  Req req;
  Resp resp;
};

// A call with raw bytes both ways (generic stub).
struct RawCall {
  grpc::ClientContext ctx;
  grpc::ByteBuffer req;
  grpc::ByteBuffer resp;
};

std::string Bytes(const grpc::ByteBuffer& bb) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!bb.Dump(&slices).ok()) return out;
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

int Run(const Options& o) {
  SetLogLevel(LogLevel::kWarning);  // per-registration log lines would dominate the figure
  SchedulerConfig config;
  config.job_name = "bench";
  config.num_servers = o.servers;
  config.num_workers = o.workers;
  config.dispatch = o.dispatch;
  config.slice_bytes = o.slice_bytes;
  config.heartbeat_timeout = std::chrono::minutes(10);
  SchedulerServerOptions sopt;
  sopt.host = "127.0.0.1";
  sopt.service.token = "bench-token";
  auto server_or = SchedulerServer::Start(config, sopt);
  if (!server_or.ok()) {
    std::fprintf(stderr, "bench_scheduler: %s\n", server_or.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<SchedulerServer> server = std::move(server_or).value();

  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<v1::Scheduler::Stub>> stubs;
  std::vector<std::unique_ptr<grpc::GenericStub>> generic;
  for (int i = 0; i < o.channels; ++i) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.use_local_subchannel_pool", 1);  // one TCP connection per channel
    args.SetInt("bench.channel", i);
    args.SetMaxReceiveMessageSize(256 << 20);
    args.SetMaxSendMessageSize(256 << 20);
    channels.push_back(
        grpc::CreateCustomChannel(server->address(), grpc::InsecureChannelCredentials(), args));
    stubs.push_back(v1::Scheduler::NewStub(channels.back()));
    generic.push_back(std::make_unique<grpc::GenericStub>(channels.back()));
  }
  const auto timeout = std::chrono::seconds(o.timeout_s);
  auto prepare = [&](grpc::ClientContext* ctx) {
    ctx->AddMetadata(kTokenMetadataKey, "bench-token");
    ctx->set_deadline(std::chrono::system_clock::now() + timeout);
    ctx->set_wait_for_ready(true);
  };
  auto fail = [&](const char* phase, Latch& latch, bool finished) {
    std::fprintf(stderr, "bench_scheduler: %s: %s\n", phase,
                 finished ? latch.first_error().error_message().c_str() : "timed out");
    server->Shutdown();
    return 1;
  };
  const int agents = o.servers + o.workers;

  // Warm-up: connect every channel.
  for (auto& ch : channels) {
    if (!ch->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
      std::fprintf(stderr, "bench_scheduler: cannot connect to %s\n", server->address().c_str());
      server->Shutdown();
      return 1;
    }
  }

  // Baseline: `agents` bare unary calls, all in flight at once.
  Clock::duration baseline;
  {
    Latch latch;
    std::vector<std::unique_ptr<Call<v1::GetJobRequest, v1::GetJobResponse>>> calls;
    latch.Add(agents);
    auto t0 = Clock::now();
    for (int i = 0; i < agents; ++i) {
      calls.push_back(std::make_unique<Call<v1::GetJobRequest, v1::GetJobResponse>>());
      auto* c = calls.back().get();
      prepare(&c->ctx);
      stubs[static_cast<size_t>(i % o.channels)]->async()->GetJob(
          &c->ctx, &c->req, &c->resp, [&latch](grpc::Status st) { latch.Done(st); });
    }
    bool ok = latch.Wait(timeout);
    baseline = Clock::now() - t0;
    if (!ok || !latch.first_error().ok()) return fail("baseline", latch, ok);
  }

  // Declarations, serialized up front: every worker sends the same keys (field 2) after its
  // own rank (field 1); the key bytes are shared by all requests.
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<double> log_size(0.0, 22.0);  // 1 .. 4M elements
  v1::DeclareKeysRequest keys_only;
  for (int k = 0; k < o.keys; ++k) {
    auto* key = keys_only.add_keys();
    key->set_id(rng());
    key->set_name("layer" + std::to_string(k / 2) + (k % 2 == 0 ? ".weight" : ".bias"));
    key->set_num_elements(static_cast<int64_t>(std::exp2(log_size(rng))));
    key->set_dtype(v1::DTYPE_FLOAT32);
  }
  const std::string key_bytes = keys_only.SerializeAsString();
  grpc::Slice shared_keys(key_bytes.data(), key_bytes.size());

  auto t_start = Clock::now();
  // Phase 1: every agent registers.
  {
    Latch latch;
    std::vector<std::unique_ptr<Call<v1::RegisterRequest, v1::RegisterResponse>>> calls;
    latch.Add(agents);
    for (int i = 0; i < agents; ++i) {
      calls.push_back(std::make_unique<Call<v1::RegisterRequest, v1::RegisterResponse>>());
      auto* c = calls.back().get();
      const bool is_server = i < o.servers;
      c->req.set_job("bench");
      c->req.set_role(is_server ? v1::ROLE_SERVER : v1::ROLE_WORKER);
      c->req.set_pod_name(is_server ? "bench-server-" + std::to_string(i)
                                    : "bench-worker-" + std::to_string(i - o.servers));
      c->req.set_host("127.0.0.1");
      prepare(&c->ctx);
      stubs[static_cast<size_t>(i % o.channels)]->async()->Register(
          &c->ctx, &c->req, &c->resp, [&latch](grpc::Status st) { latch.Done(st); });
    }
    bool ok = latch.Wait(timeout);
    if (!ok || !latch.first_error().ok()) return fail("register", latch, ok);
  }
  auto t_phase1 = Clock::now();
  // Phase 2: every agent long-polls for the complete view; the servers report ready.
  // Answers stay raw bytes here (each agent parses its own view on its own machine); they are
  // checked after the clock stops.
  grpc::ByteBuffer poll_bytes;
  {
    v1::GetClusterRequest wait_complete;
    wait_complete.set_wait_complete(true);
    const std::string b = wait_complete.SerializeAsString();
    grpc::Slice slice(b);
    poll_bytes = grpc::ByteBuffer(&slice, 1);
  }
  std::vector<std::unique_ptr<RawCall>> polls;
  {
    Latch latch;
    std::vector<std::unique_ptr<Call<v1::ReportReadyRequest, v1::ReportReadyResponse>>> readies;
    latch.Add(agents + o.servers);
    for (int i = 0; i < agents; ++i) {
      polls.push_back(std::make_unique<RawCall>());
      auto* c = polls.back().get();
      c->req = poll_bytes;
      prepare(&c->ctx);
      generic[static_cast<size_t>(i % o.channels)]->UnaryCall(
          &c->ctx, "/trellis.v1.Scheduler/GetCluster", grpc::StubOptions(), &c->req, &c->resp,
          [&latch](grpc::Status st) { latch.Done(st); });
    }
    for (int r = 0; r < o.servers; ++r) {
      readies.push_back(std::make_unique<Call<v1::ReportReadyRequest, v1::ReportReadyResponse>>());
      auto* c = readies.back().get();
      c->req.set_role(v1::ROLE_SERVER);
      c->req.set_rank(r);
      c->req.set_address("127.0.0.1:" + std::to_string(20000 + r));
      prepare(&c->ctx);
      stubs[static_cast<size_t>(r % o.channels)]->async()->ReportReady(
          &c->ctx, &c->req, &c->resp, [&latch](grpc::Status st) { latch.Done(st); });
    }
    bool ok = latch.Wait(timeout);
    if (!ok || !latch.first_error().ok()) return fail("cluster view", latch, ok);
  }
  auto t_registered = Clock::now();
  // Phase 3: every worker declares the keys and gets the map.
  std::vector<std::unique_ptr<RawCall>> declares;
  {
    Latch latch;
    latch.Add(o.workers);
    for (int w = 0; w < o.workers; ++w) {
      declares.push_back(std::make_unique<RawCall>());
      auto* c = declares.back().get();
      v1::DeclareKeysRequest head;
      head.set_worker_rank(w);
      const std::string head_bytes = head.SerializeAsString();
      grpc::Slice parts[2] = {grpc::Slice(head_bytes.data(), head_bytes.size()), shared_keys};
      c->req = grpc::ByteBuffer(parts, 2);
      prepare(&c->ctx);
      generic[static_cast<size_t>(w % o.channels)]->UnaryCall(
          &c->ctx, "/trellis.v1.Scheduler/DeclareKeys", grpc::StubOptions(), &c->req, &c->resp,
          [&latch](grpc::Status st) { latch.Done(st); });
    }
    bool ok = latch.Wait(timeout);
    if (!ok || !latch.first_error().ok()) return fail("declare keys", latch, ok);
  }
  auto t_end = Clock::now();
  server->Shutdown();

  // Check the answers: every agent got the same complete view, every worker the same map.
  v1::ClusterView view;
  v1::DeclareKeysResponse map;
  const std::string view_bytes = Bytes(polls[0]->resp);
  const std::string map_bytes = Bytes(declares[0]->resp);
  if (!view.ParseFromString(view_bytes) || !view.complete() ||
      view.servers_size() != o.servers || view.workers_size() != o.workers) {
    std::fprintf(stderr, "bench_scheduler: bad cluster view\n");
    return 1;
  }
  if (!map.ParseFromString(map_bytes) || map.shard_map().keys_size() != o.keys) {
    std::fprintf(stderr, "bench_scheduler: bad shard map\n");
    return 1;
  }
  for (const auto& c : polls) {
    if (Bytes(c->resp) != view_bytes) {
      std::fprintf(stderr, "bench_scheduler: agents got different views\n");
      return 1;
    }
  }
  for (const auto& c : declares) {
    if (Bytes(c->resp) != map_bytes) {
      std::fprintf(stderr, "bench_scheduler: workers got different shard maps\n");
      return 1;
    }
  }
  const int map_keys = map.shard_map().keys_size();

  const double total_ms = Ms(t_end - t_start);
  std::printf("bench_scheduler: %d agents (%d servers + %d workers), %d keys, dispatch %s, "
              "sliceBytes %lld, %d channels, loopback\n",
              agents, o.servers, o.workers, map_keys, o.dispatch.c_str(),
              static_cast<long long>(o.slice_bytes), o.channels);
  std::printf("  %-44s %10.1f ms\n", "register (all agents)", Ms(t_phase1 - t_start));
  std::printf("  %-44s %10.1f ms  (view %.1f KiB x %d answers)\n",
              "servers ready -> complete view (all agents)", Ms(t_registered - t_phase1),
              static_cast<double>(view_bytes.size()) / 1024.0, agents);
  std::printf("  %-44s %10.1f ms  (map %.1f KiB x %d answers)\n",
              "declare keys -> shard map (all workers)", Ms(t_end - t_registered),
              static_cast<double>(map_bytes.size()) / 1024.0, o.workers);
  std::printf("  %-44s %10.1f ms  goal < 1000 ms: %s\n", "total", total_ms,
              total_ms < 1000.0 ? "met" : "NOT met");
  std::printf("  %-44s %10.1f ms\n", "baseline: bare unary calls (GetJob), same count", Ms(baseline));
  return 0;
}

bool ParseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (a != name || i + 1 >= argc) return nullptr;
      return argv[++i];
    };
    const char* v = nullptr;
    if ((v = value("--servers"))) o->servers = std::atoi(v);
    else if ((v = value("--workers"))) o->workers = std::atoi(v);
    else if ((v = value("--keys"))) o->keys = std::atoi(v);
    else if ((v = value("--channels"))) o->channels = std::atoi(v);
    else if ((v = value("--seed"))) o->seed = std::strtoull(v, nullptr, 10);
    else if ((v = value("--slice-bytes"))) o->slice_bytes = std::atoll(v);
    else if ((v = value("--dispatch"))) o->dispatch = v;
    else if ((v = value("--timeout"))) o->timeout_s = std::atoi(v);
    else {
      std::fprintf(stderr,
                   "usage: bench_scheduler [--servers N] [--workers N] [--keys N] [--channels N]\n"
                   "  [--seed N] [--slice-bytes B] [--dispatch D] [--timeout SECONDS]\n");
      return false;
    }
  }
  if (o->servers < 1 || o->workers < 1 || o->keys < 1 || o->channels < 1 || o->timeout_s < 1) {
    std::fprintf(stderr, "bench_scheduler: counts and timeout must be >= 1\n");
    return false;
  }
  return true;
}

}  // namespace
}  // namespace trellis

int main(int argc, char** argv) {
  trellis::Options o;
  if (!trellis::ParseArgs(argc, argv, &o)) return 2;
  return trellis::Run(o);
}
