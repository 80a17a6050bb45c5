// trellis-test-worker: a training program stand-in for the integration tests and `make run`.
// Declares the same keys on every rank, passes barrier "a", optionally dies (SIGKILL) once,
// passes barrier "b", checks that its rank is the one the scheduler holds for its pod.
//
// Environment (from the agent): TRELLIS_SCHEDULER, TRELLIS_TOKEN_FILE, TRELLIS_RANK,
// TRELLIS_INCARNATION, TRELLIS_POD_NAME. Test knobs: TEST_CRASH_WORKER_RANK (the rank that
// raises SIGKILL on its first incarnation), TEST_HOLD_SECONDS (sleep after barrier "a").
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "common/tls/auth.h"
#include "common/config/env.h"
#include "scheduler/scheduler_client.h"

namespace {

using namespace trellis;
using std::chrono::milliseconds;

int Fail(const std::string& what, const Status& s) {
  std::printf("test-worker: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::fflush(stdout);
  return 1;
}

int Main() {
  EnvSource env;
  auto address = env.Required("TRELLIS_SCHEDULER");
  auto rank = env.RequiredInt("TRELLIS_RANK", 0, 1 << 20);
  auto incarnation = env.RequiredInt("TRELLIS_INCARNATION", 1, 1 << 30);
  auto pod = env.Required("TRELLIS_POD_NAME");
  auto token = ReadTokenFile(env.GetOr("TRELLIS_TOKEN_FILE", ""));
  for (const Status* s : {&address.status(), &rank.status(), &incarnation.status(), &pod.status(), &token.status()}) {
    if (!s->ok()) return Fail("environment", *s);
  }
  auto crash_rank = env.OptionalInt("TEST_CRASH_WORKER_RANK", -1, 1 << 20);
  auto hold = env.OptionalInt("TEST_HOLD_SECONDS", 0, 3600);
  if (!crash_rank.ok()) return Fail("environment", crash_rank.status());
  if (!hold.ok()) return Fail("environment", hold.status());

  const int32_t r = static_cast<int32_t>(*rank);
  std::printf("test-worker pod %s rank %d incarnation %lld\n", pod->c_str(), r,
              static_cast<long long>(*incarnation));
  std::fflush(stdout);

  auto client = SchedulerClient::Connect({*address, *token, milliseconds(10000)});
  if (!client.ok()) return Fail("connect", client.status());
  std::vector<v1::KeySpec> keys;
  for (int k = 0; k < 3; ++k) {
    v1::KeySpec key;
    key.set_id(static_cast<uint64_t>(100 + k));
    key.set_name("layer" + std::to_string(k));
    key.set_num_elements(1000 * (k + 1));
    key.set_dtype(v1::DTYPE_FLOAT32);
    keys.push_back(key);
  }
  auto map = (*client)->DeclareKeys(r, keys, milliseconds(60000));
  if (!map.ok()) return Fail("declare keys", map.status());
  std::printf("declared %d keys over %d servers\n", map->keys_size(), map->num_servers());

  if (Status s = (*client)->Barrier("a", v1::ROLE_WORKER, r, 0, false, milliseconds(60000)); !s.ok()) {
    return Fail("barrier a", s);
  }
  std::printf("passed barrier a\n");
  std::fflush(stdout);
  if (hold->has_value()) std::this_thread::sleep_for(std::chrono::seconds(**hold));
  if (crash_rank->has_value() && **crash_rank == r && *incarnation == 1) {
    std::printf("rank %d raising SIGKILL on purpose\n", r);
    std::fflush(stdout);
    raise(SIGKILL);
  }
  if (Status s = (*client)->Barrier("b", v1::ROLE_WORKER, r, 0, false, milliseconds(60000)); !s.ok()) {
    return Fail("barrier b", s);
  }
  std::printf("passed barrier b\n");

  auto view = (*client)->GetCluster(0, false, milliseconds(10000));
  if (!view.ok()) return Fail("cluster view", view.status());
  if (r >= view->workers_size() || view->workers(r).pod_name() != *pod) {
    std::printf("test-worker: rank mismatch: TRELLIS_RANK %d but the scheduler holds %s there\n", r,
                r < view->workers_size() ? view->workers(r).pod_name().c_str() : "nothing");
    return 1;
  }
  std::printf("done rank %d\n", r);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main() { return Main(); }
