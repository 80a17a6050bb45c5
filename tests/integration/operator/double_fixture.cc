#include "tests/integration/operator/double_fixture.h"

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>

#include <cpprest/http_client.h>

#include "common/config/env.h"

namespace trellis::op::testing {

void DoubleTest::SetUp() {
  char tmpl[] = "/tmp/trellis-k8s-double-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  dir_ = tmpl;
  SpawnOptions o;
  o.argv = {"/usr/bin/python3", TRELLIS_K8S_DOUBLE, "--port-file", dir_ + "/port"};
  for (auto& a : DoubleArgs()) o.argv.push_back(a);
  o.env = CurrentEnvironment();
  o.stdout_mode = SpawnOptions::Output::kFile;
  o.stdout_path = dir_ + "/double.log";
  o.stderr_mode = SpawnOptions::Output::kStdout;
  auto p = Subprocess::Start(o);
  ASSERT_TRUE(p.ok()) << p.status().message();
  double_ = std::move(*p);
  std::string port;
  ASSERT_TRUE(WaitFor(
      [&] {
        std::ifstream in(dir_ + "/port");
        return static_cast<bool>(in >> port);
      },
      std::chrono::seconds(20)))
      << "the API double did not start; see " << dir_ << "/double.log";
  KubeConfig c = ClientConfig(port);
  server_ = c.server;
  client_ = std::make_unique<KubeClient>(c, std::chrono::seconds(5));
}

void DoubleTest::TearDown() {
  client_.reset();
  double_.reset();  // SIGTERM, then SIGKILL, reaped
  std::error_code ec;
  if (!dir_.empty() && !HasFailure()) std::filesystem::remove_all(dir_, ec);
}

Json DoubleTest::CreateJob(const std::string& name, const std::string& spec_json) {
  auto job = ParseJson(R"({"apiVersion":"trellis.io/v1alpha1","kind":"TrainingJob","metadata":{"name":")" + name +
                       R"("},"spec":)" + spec_json + "}");
  EXPECT_TRUE(job.has_value()) << spec_json;
  auto created = client_->Create(kTrainingJobs, "default", *job);
  EXPECT_TRUE(created.ok()) << created.status().message();
  return created.ok() ? *created : Json();
}

Json DoubleTest::GetJob(const std::string& name) {
  auto j = client_->Get(kTrainingJobs, "default", name);
  return j.ok() ? *j : Json();
}

std::vector<std::string> DoubleTest::PodNames(const std::string& job) {
  std::vector<std::string> out;
  auto list = client_->List(kPods, "default", "trellis.io/job-name=" + job);
  EXPECT_TRUE(list.ok()) << list.status().message();
  if (!list.ok()) return out;
  const Json& items = list->at("items");
  for (size_t i = 0; i < items.size(); ++i) out.push_back(Str(items.at(i), {"metadata", "name"}));
  std::sort(out.begin(), out.end());
  return out;
}

void DoubleTest::SetPodPhase(const std::string& pod, const std::string& phase, int exit_code) {
  std::string patch = R"({"status":{"phase":")" + phase + "\"";
  if (exit_code >= 0) {
    patch += R"(,"containerStatuses":[{"name":"trellis","state":{"terminated":{"exitCode":)" +
             std::to_string(exit_code) + "}}}]";
  }
  patch += "}}";
  auto r = client_->MergePatch(kPods, "default", pod, *ParseJson(patch), /*status=*/true);
  ASSERT_TRUE(r.ok()) << r.status().message();
}

void DoubleTest::SetAllPodsPhase(const std::string& job, const std::string& phase) {
  for (const auto& p : PodNames(job)) SetPodPhase(p, phase);
}

Json DoubleTest::Stats() {
  web::http::client::http_client c(server_);
  return c.request(web::http::methods::GET, "/_double/stats").get().extract_json().get();
}

void DoubleTest::Hook(const std::string& what) {
  web::http::client::http_client c(server_);
  ASSERT_EQ(c.request(web::http::methods::POST, "/_double/" + what).get().status_code(), 200);
}

bool DoubleTest::WaitFor(const std::function<bool()>& cond, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return cond();
}

std::string DoubleTest::Condition(const Json& job, const std::string& type, const char* field) {
  const Json* conds = At(job, {"status", "conditions"});
  if (!conds || !conds->is_array()) return "<none>";
  for (size_t i = 0; i < conds->size(); ++i) {
    if (Str(conds->at(i), {"type"}) == type) return Str(conds->at(i), {field});
  }
  return "<none>";
}

}  // namespace trellis::op::testing
