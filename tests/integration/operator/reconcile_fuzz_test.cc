// Property test: the reconciler against the API double, fed TrainingJobs that are partial,
// mistyped, null-ridden, huge or deeply nested (spec and status, as anyone with write access to
// them could make). Whatever the job holds, Reconcile returns (no exception, no crash), and the
// job is either reconciled normally or Failed with a reason and a message. A fixed corpus of
// known killers first, then seeded random mutations for a bounded time.
#include <gtest/gtest.h>

#include <iostream>
#include <random>
#include <set>

#include "tests/integration/operator/reconcile_fixture.h"

namespace trellis::op::testing {
namespace {

constexpr char kBase[] = R"({"image":"img:1",
  "servers":{"replicas":1,"env":[{"name":"S","value":"1"}],"template":{"spec":{"tolerations":[{"key":"k"}]}}},
  "workers":{"replicas":2,"command":["w","--x"],"args":["a"],"env":[{"name":"A","value":"b"}],
             "resources":{"requests":{"cpu":"1","memory":"1Gi"},"limits":{"cpu":"2"}},"restartPolicy":"OnFailure",
             "template":{"metadata":{"labels":{"pool":"a"}},
                         "spec":{"nodeSelector":{"pool":"a"},"containers":[{"name":"trellis","env":[{"name":"E","value":"1"}]},
                                                                          {"name":"side","image":"s:1"}],
                                 "volumes":[{"name":"v","emptyDir":{}}]}}},
  "keyDispatch":"hash","sliceBytes":"4Ki","compression":{"type":"2bit","threshold":0.5},
  "runPolicy":{"backoffLimit":2,"activeDeadlineSeconds":600,"ttlSecondsAfterFinished":60,"cleanPodPolicy":"All"}})";

Json Deep(int depth) {
  Json v = JStr("bottom");
  for (int i = 0; i < depth; ++i) {
    Json o = Json::object();
    o[i % 2 ? "a" : "b"] = v;
    v = Json::array();
    v[0] = o;
  }
  return v;
}

class Mutator {
 public:
  explicit Mutator(uint32_t seed) : rng_(seed) {}

  Json RandomValue() {
    switch (Pick(11)) {
      case 0: return Json::null();
      case 1: return Json::boolean(Pick(2) == 1);
      case 2: return Json::number(static_cast<int64_t>(rng_()) - (int64_t{1} << 31));
      case 3: return Json::number(1e300);
      case 4: return JStr(std::string(1 + Pick(120000), "a-Z9.\x01"[Pick(6)]));
      case 5: return Json::array();
      case 6: return Json::object();
      case 7: return Deep(60 + Pick(90));  // 120..300 levels: beyond cpprestsdk's 128
      case 8: return JStr("");
      case 9: return Json::number(-0.5);
      default: return JStr("Never");
    }
  }

  // Applies 1..4 random edits somewhere inside `v` (which must be an object or array).
  void Mutate(Json& v) {
    for (int n = 1 + Pick(4); n > 0; --n) Edit(v);
  }

 private:
  uint32_t Pick(uint32_t n) { return std::uniform_int_distribution<uint32_t>(0, n - 1)(rng_); }

  void Edit(Json& v) {
    Json* cur = &v;
    // Walk down a random path, stopping at random.
    for (int d = 0; d < 8; ++d) {
      const bool container = (cur->is_object() && cur->size() > 0) || (cur->is_array() && cur->size() > 0);
      if (!container || Pick(3) == 0) break;
      Json* next = nullptr;
      if (cur->is_object()) {
        auto& obj = cur->as_object();
        auto it = obj.begin();
        std::advance(it, Pick(static_cast<uint32_t>(obj.size())));
        next = &it->second;
      } else {
        next = &(*cur)[Pick(static_cast<uint32_t>(cur->size()))];
      }
      if (!next->is_object() && !next->is_array()) {
        // Replace or delete this leaf.
        if (cur->is_object() && Pick(3) == 0) {
          auto& obj = cur->as_object();
          for (auto it = obj.begin(); it != obj.end(); ++it) {
            if (&it->second == next) {
              const std::string key = it->first;
              cur->erase(key);
              return;
            }
          }
        }
        *next = RandomValue();
        return;
      }
      cur = next;
    }
    if (cur->is_object()) {
      static const char* keys[] = {"containers", "volumes", "spec", "template", "replicas", "command",
                                   "env", "name", "nodeSelector", "metadata", "labels", "x-unknown"};
      if (cur->size() > 0 && Pick(2) == 0) {
        auto& obj = cur->as_object();
        auto it = obj.begin();
        std::advance(it, Pick(static_cast<uint32_t>(obj.size())));
        cur->erase(std::string(it->first));
      } else {
        (*cur)[keys[Pick(12)]] = RandomValue();
      }
    } else if (cur->is_array()) {
      (*cur)[cur->size()] = RandomValue();
    } else {
      *cur = RandomValue();
    }
  }

  std::mt19937 rng_;
};

class ReconcileFuzzTest : public ReconcileTest {
 protected:
  // Creates the job (spec, then status through the subresource), reconciles it twice (with its
  // pods running in between), checks the outcome and deletes the job. Returns the job as last
  // seen; nullopt after a failed check.
  std::optional<Json> Check(const std::string& name, const Json& spec, const Json* status, const std::string& what) {
    Json job = Json::object();
    job["apiVersion"] = JStr("trellis.io/v1alpha1");
    job["kind"] = JStr("TrainingJob");
    Put(job, {"metadata", "name"}, JStr(name));
    job["spec"] = spec;
    auto created = client_->Create(kTrainingJobs, "default", job);
    if (!created.ok()) {
      ADD_FAILURE() << what << ": the double refused the job: " << created.status().message();
      return std::nullopt;
    }
    if (status) {
      Json s = *created;
      s["status"] = *status;
      auto w = client_->UpdateStatus(kTrainingJobs, "default", name, s);
      EXPECT_TRUE(w.ok()) << w.status().message();
    }
    for (int round = 0; round < 2; ++round) {
      auto r = reconciler_->Reconcile("default", name);
      if (!r.ok()) {
        ADD_FAILURE() << what << ": Reconcile failed: " << r.status().message().substr(0, 300);
        return std::nullopt;
      }
      now_ += std::chrono::seconds(1);
      if (round == 0) SetAllPodsPhase(name, "Running");
    }
    Json got = GetJob(name);
    const std::string phase = Str(got, {"status", "phase"});
    static const std::set<std::string> phases = {"Pending", "Running", "Restarting", "Succeeded", "Failed",
                                                 "Suspended"};
    EXPECT_TRUE(phases.count(phase)) << what << ": phase \"" << phase.substr(0, 100) << "\"";
    if (phase == "Failed") {
      EXPECT_EQ(Condition(got, "Failed"), "True") << what;
      EXPECT_FALSE(Condition(got, "Failed", "reason").empty()) << what;
      EXPECT_FALSE(Condition(got, "Failed", "message").empty()) << what;
    }
    EXPECT_TRUE(client_->Delete(kTrainingJobs, "default", name).ok());
    if (HasFailure()) return std::nullopt;
    return got;
  }

};

TEST_F(ReconcileFuzzTest, KnownKillersEndReconciledOrFailedWithAReason) {
  const Json base = *ParseJson(kBase);
  struct Case {
    const char* what;
    std::string spec;
    std::string status;
  };
  const std::string big(300000, 'x');
  const std::vector<Case> cases = {
      {"template with only spec.nodeSelector",
       R"({"workers":{"command":["w"],"template":{"spec":{"nodeSelector":{"pool":"a"}}}}})", ""},
      {"template with only metadata", R"({"workers":{"command":["w"],"template":{"metadata":{}}}})", ""},
      {"template containers not a list",
       R"({"workers":{"command":["w"],"template":{"spec":{"containers":{"name":"x"},"volumes":7}}}})", ""},
      {"null everywhere", R"({"image":null,"servers":null,"workers":{"command":["w"],"template":null},"runPolicy":null})",
       ""},
      {"wrong types", R"({"workers":{"replicas":"two","command":"w","env":{"A":1}},"sliceBytes":[1]})", ""},
      {"huge numbers", R"({"workers":{"replicas":1e300,"command":["w"]},"runPolicy":{"backoffLimit":-1e300}})", ""},
      {"huge strings", R"({"image":")" + big + R"(","workers":{"command":[")" + big + R"("],"resources":{"requests":{"cpu":")" +
                           big + R"("}}}})",
       ""},
      {"no spec fields", "{}", ""},
      {"garbage status", R"({"workers":{"command":["w"]}})",
       R"({"phase":7,"conditions":[1,null,{"type":3}],"startTime":"not a time","replicaStatuses":{"worker":{"restarts":1e300}}})"},
      {"status of a finished job with junk", R"({"workers":{"command":["w"]}})",
       R"({"phase":"Succeeded","completionTime":[],"conditions":"x"})"},
      {"restarts near INT_MAX", R"({"workers":{"command":["w"]},"runPolicy":{"backoffLimit":2147483647}})",
       R"({"phase":"Running","restarts":2147483647,"replicaStatuses":{"server":{"restarts":2147483647},"worker":{"restarts":2147483647}}})"},
  };
  int i = 0;
  for (const Case& c : cases) {
    auto spec = ParseJson(c.spec);
    ASSERT_TRUE(spec) << c.what;
    auto status = c.status.empty() ? std::nullopt : ParseJson(c.status);
    ASSERT_TRUE(Check("k" + std::to_string(i++), *spec, status ? &*status : nullptr, c.what)) << c.what;
  }
  // A template of more values than any job needs (what an alias bomb expands to in a job file):
  // refused with the same limit as trellis-launch's, not copied into every pod.
  Json wide = base;
  Json list = Json::array(120000);
  for (size_t k = 0; k < 120000; ++k) list[k] = Json::number(0);
  Put(wide, {"workers", "template", "spec", "tolerations"}, list);
  auto too_big = Check("wide", wide, nullptr, "template of 120000 values");
  ASSERT_TRUE(too_big);
  EXPECT_EQ(Str(*too_big, {"status", "phase"}), "Failed");
  EXPECT_EQ(Condition(*too_big, "Failed", "reason"), "InvalidSpec");
  EXPECT_NE(Condition(*too_big, "Failed", "message").find("with its aliases expanded it holds more than 100000 values"),
            std::string::npos)
      << Condition(*too_big, "Failed", "message").substr(0, 200);

  // A pod template nested deeper than the JSON reader goes: the job fails, naming where.
  Json deep = base;
  Put(deep, {"workers", "template", "spec", "affinity"}, Deep(150));
  auto got = Check("deep", deep, nullptr, "template nested 300 levels");
  ASSERT_TRUE(got);
  EXPECT_EQ(Str(*got, {"status", "phase"}), "Failed");
  EXPECT_EQ(Condition(*got, "Failed", "reason"), "InvalidSpec");
  EXPECT_TRUE(Condition(*got, "Failed", "message").starts_with("spec.workers.template.spec.affinity[0].a[0].b[0].a"))
      << Condition(*got, "Failed", "message").substr(0, 200);
  EXPECT_NE(Condition(*got, "Failed", "message").find("nested deeper than 100 levels"), std::string::npos);
}

TEST_F(ReconcileFuzzTest, RandomJobsForAFewSeconds) {
  const Json base = *ParseJson(kBase);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(4);
  uint32_t seed = 1;
  for (; std::chrono::steady_clock::now() < until; ++seed) {
    Mutator m(seed);
    Json spec = base;
    m.Mutate(spec);
    Json status = Json::object();
    const bool with_status = seed % 4 == 0;
    if (with_status) {
      status = *ParseJson(R"({"phase":"Running","startTime":"2027-01-15T08:00:00Z","restarts":1,
        "replicaStatuses":{"worker":{"restarts":1}},"conditions":[{"type":"Running","status":"True"}]})");
      m.Mutate(status);
    }
    ASSERT_TRUE(Check("r" + std::to_string(seed), spec, with_status ? &status : nullptr,
                      "seed " + std::to_string(seed)))
        << "seed " << seed;
  }
  std::cout << "reconciled " << seed - 1 << " random jobs\n";
  EXPECT_GE(seed, 5u);  // even a loaded machine gets through a few
}

}  // namespace
}  // namespace trellis::op::testing
