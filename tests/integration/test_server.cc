// trellis-test-server: a parameter-server stand-in. Reports a dummy data address as ready and
// waits for SIGTERM/SIGINT, then exits 0.
#include <signal.h>

#include <cstdio>

#include "common/tls/auth.h"
#include "common/config/env.h"
#include "scheduler/scheduler_client.h"

int main() {
  using namespace trellis;
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);  // before gRPC starts threads

  EnvSource env;
  auto address = env.Required("TRELLIS_SCHEDULER");
  auto rank = env.RequiredInt("TRELLIS_RANK", 0, 1 << 20);
  auto token = ReadTokenFile(env.GetOr("TRELLIS_TOKEN_FILE", ""));
  for (const Status* s : {&address.status(), &rank.status(), &token.status()}) {
    if (!s->ok()) {
      std::fprintf(stderr, "test-server: %s\n", s->ToString().c_str());
      return 1;
    }
  }
  auto client = SchedulerClient::Connect({*address, *token, std::chrono::milliseconds(10000)});
  if (!client.ok()) {
    std::fprintf(stderr, "test-server: %s\n", client.status().ToString().c_str());
    return 1;
  }
  const int32_t r = static_cast<int32_t>(*rank);
  std::string data_address = "127.0.0.1:" + std::to_string(20000 + r);  // nothing listens: a dummy
  if (Status s = (*client)->ReportReady(v1::ROLE_SERVER, r, data_address); !s.ok()) {
    std::fprintf(stderr, "test-server: report ready: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("test-server rank %d ready at %s\n", r, data_address.c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&sigs, &sig);
  std::printf("test-server rank %d stopping on signal %d\n", r, sig);
  return 0;
}
