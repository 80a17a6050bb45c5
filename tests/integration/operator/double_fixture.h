// A fixture that runs the Kubernetes API double (tests/k8s_double/k8s_double.py) on a free port
// and talks to it with the operator's own client, plus helpers that play the kubelet.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/process/subprocess.h"
#include "operator/kube_client.h"

namespace trellis::op::testing {

class DoubleTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
  // Hooks for fixtures that run the double differently (HTTPS, a token): called in SetUp after
  // dir_ exists.
  virtual std::vector<std::string> DoubleArgs() { return {}; }
  virtual KubeConfig ClientConfig(const std::string& port) {
    KubeConfig c;
    c.server = "http://127.0.0.1:" + port;
    return c;
  }

  // POSTs a TrainingJob named `name` in namespace "default" with the given spec (JSON text).
  Json CreateJob(const std::string& name, const std::string& spec_json);
  Json GetJob(const std::string& name);
  // Names of the job's pods, sorted.
  std::vector<std::string> PodNames(const std::string& job);
  // The kubelet's part: sets a pod's phase (and the container's exit code when terminated).
  void SetPodPhase(const std::string& pod, const std::string& phase, int exit_code = -1);
  void SetAllPodsPhase(const std::string& job, const std::string& phase);
  // The double's count of creations per kind and name (no duplicate ever created).
  Json Stats();
  void Hook(const std::string& what);  // "compact", "break-watches"
  // Polls `cond` until true or `timeout`; the condition is the synchronisation, not the sleep.
  static bool WaitFor(const std::function<bool()>& cond, std::chrono::milliseconds timeout);
  static std::string Condition(const Json& job, const std::string& type, const char* field = "status");

  std::string dir_;
  std::string server_;
  std::unique_ptr<Subprocess> double_;
  std::unique_ptr<KubeClient> client_;
};

}  // namespace trellis::op::testing
