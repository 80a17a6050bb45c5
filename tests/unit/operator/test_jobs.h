// Job documents shared by the operator's unit tests.
#pragma once

#include <string>

#include "common/job/job_spec.h"
#include "operator/json_util.h"

namespace trellis::op::testing {

// A TrainingJob as the API server returns it (metadata.uid, resourceVersion, status).
inline Json ApiJob(const std::string& spec_json, const std::string& status_json = "{}") {
  std::string text = R"({"apiVersion":"trellis.io/v1alpha1","kind":"TrainingJob",
    "metadata":{"name":"mlp","namespace":"team","uid":"u-1","resourceVersion":"7","labels":{"app":"demo"}},
    "spec":)" + spec_json + R"(,"status":)" + status_json + "}";
  return *ParseJson(text);
}

inline constexpr char kSpec[] =
    R"({"image":"reg/trellis:1","servers":{"replicas":2},
        "workers":{"replicas":3,"command":["trellis-mlp"],"args":["--steps","10"],"gpusPerWorker":1,
                   "env":[{"name":"A","value":"b"}],
                   "resources":{"requests":{"cpu":"2","memory":"4Gi"}}},
        "runPolicy":{"backoffLimit":2}})";

inline JobSpec Spec(const Json& job) { return *ParseJobSpec(job.serialize()); }

}  // namespace trellis::op::testing
