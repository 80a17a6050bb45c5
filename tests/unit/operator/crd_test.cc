// The CRD is checked against the one job model (common/job/job_spec.h): every field the schema
// declares is one ParseJobSpec accepts (with every enum value, and defaults equal to the
// model's), every field of the annotated full example is in the schema, and the schema is
// structural (apiextensions.k8s.io/v1 rules). manifests/crd.yaml must equal the chart's copy.
#include <algorithm>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "common/job/job_spec.h"

namespace trellis {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const std::string kChartCrd = std::string(TRELLIS_SOURCE_DIR) + "/charts/trellis/crds/trainingjobs.trellis.io.yaml";

YAML::Node Crd() { return YAML::LoadFile(kChartCrd); }
YAML::Node Version() { return Crd()["spec"]["versions"][0]; }
YAML::Node SpecSchema() { return Version()["schema"]["openAPIV3Schema"]["properties"]["spec"]; }

constexpr char kMinimal[] = "apiVersion: trellis.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: j}\n";

// A document with spec.<path> = value (YAML flow text) over a job that is otherwise minimal.
std::string JobWith(const std::vector<std::string>& path, const std::string& value) {
  YAML::Node doc = YAML::Load(kMinimal);
  YAML::Node spec = YAML::Load("{workers: {command: [w]}}");
  std::function<void(YAML::Node, size_t)> put = [&](YAML::Node n, size_t i) {
    if (i + 1 == path.size()) {
      n[path[i]] = YAML::Load(value);
      return;
    }
    if (!n[path[i]]) n[path[i]] = YAML::Node(YAML::NodeType::Map);
    put(n[path[i]], i + 1);
  };
  put(spec, 0);
  doc["spec"] = spec;
  YAML::Emitter out;
  out << doc;
  return out.c_str();
}

// The job with leaf = value, plus the sibling a leaf is only valid with (a Volcano queue needs
// gangScheduler volcano, a coscheduling timeout scheduler-plugins).
std::string LeafJob(const std::vector<std::string>& path, const std::string& value) {
  const std::vector<std::string> policy = {"runPolicy", "schedulingPolicy"};
  if (path.size() == 3 && std::equal(policy.begin(), policy.end(), path.begin())) {
    if (path[2] == "queue") return JobWith(policy, "{gangScheduler: volcano, queue: " + value + "}");
    if (path[2] == "scheduleTimeoutSeconds") {
      return JobWith(policy, "{gangScheduler: scheduler-plugins, scheduleTimeoutSeconds: " + value + "}");
    }
  }
  // A TLS file is only valid with the other two.
  if (path.size() == 2 && path[0] == "tls" && path[1] != "secretName" && path[1] != "serverName") {
    std::string files = "{";
    for (const char* f : {"caFile", "certFile", "keyFile"}) {
      files += std::string(files.size() > 1 ? ", " : "") + f + ": " + (path[1] == f ? value : "x");
    }
    return JobWith({"tls"}, files + "}");
  }
  // The elastic bounds come as a pair (replicas is 1 here).
  if (path.size() == 2 && path[0] == "elastic") {
    if (path[1] == "minWorkers") return JobWith({"elastic"}, "{minWorkers: " + value + ", maxWorkers: 1}");
    if (path[1] == "maxWorkers") return JobWith({"elastic"}, "{minWorkers: 1, maxWorkers: " + value + "}");
    return JobWith({"elastic"}, "{minWorkers: 1, maxWorkers: 1, " + path[1] + ": " + value + "}");
  }
  // The checkpoint volume is mounted at the checkpoint path: only valid with one.
  if (path.size() == 2 && path[0] == "checkpoint" && path[1] == "volume") {
    return JobWith({"checkpoint"}, "{path: /ckpt, volume: " + value + "}");
  }
  return JobWith(path, value);
}

std::string Join(const std::vector<std::string>& p) {
  std::string s = "spec";
  for (const auto& k : p) s += "." + k;
  return s;
}

struct Leaf {
  std::vector<std::string> path;
  YAML::Node schema;
};

void CollectLeaves(const YAML::Node& schema, std::vector<std::string> path, std::vector<Leaf>& out) {
  if (schema["properties"]) {
    for (const auto& kv : schema["properties"]) {
      auto p = path;
      p.push_back(kv.first.as<std::string>());
      CollectLeaves(kv.second, p, out);
    }
    return;
  }
  out.push_back({path, schema});
}

// Sample values a leaf of this schema takes (YAML flow text).
std::vector<std::string> Samples(const Leaf& leaf) {
  const YAML::Node& s = leaf.schema;
  if (s["enum"]) {
    std::vector<std::string> v;
    for (const auto& e : s["enum"]) v.push_back(e.as<std::string>());
    return v;
  }
  if (s["x-kubernetes-int-or-string"]) {
    if (leaf.path.back() == "sliceBytes") return {"2Mi", "1048576"};
    return {"\"500m\"", "2"};  // quantities: a string or a plain integer
  }
  if (s["x-kubernetes-preserve-unknown-fields"]) return {"{spec: {nodeSelector: {pool: a}}}"};
  const std::string type = s["type"].as<std::string>("");
  if (type == "string") return {"x"};
  if (type == "boolean") return {"true", "false"};
  if (type == "integer" || type == "number") {
    if (s["default"]) return {s["default"].as<std::string>()};
    if (s["minimum"]) return {s["minimum"].as<std::string>()};
    return {"1"};
  }
  if (type == "array") {
    if (s["items"]["type"].as<std::string>("") == "string") return {"[x, y]"};
    return {"[{name: A, value: b}]"};
  }
  return {};
}

TEST(CrdTest, ChartAndManifestCopiesAreIdentical) {
  EXPECT_EQ(Slurp(kChartCrd), Slurp(std::string(TRELLIS_SOURCE_DIR) + "/manifests/crd.yaml"));
}

TEST(CrdTest, NamesScopeSubresourceAndPrinterColumns) {
  YAML::Node crd = Crd();
  EXPECT_EQ(crd["apiVersion"].as<std::string>(), "apiextensions.k8s.io/v1");
  EXPECT_EQ(crd["kind"].as<std::string>(), "CustomResourceDefinition");
  EXPECT_EQ(crd["metadata"]["name"].as<std::string>(), "trainingjobs.trellis.io");
  EXPECT_EQ(crd["spec"]["group"].as<std::string>(), "trellis.io");
  EXPECT_EQ(crd["spec"]["scope"].as<std::string>(), "Namespaced");
  EXPECT_EQ(crd["spec"]["names"]["kind"].as<std::string>(), std::string(kJobKind));
  EXPECT_EQ(crd["spec"]["names"]["shortNames"][0].as<std::string>(), "tj");
  YAML::Node v = Version();
  EXPECT_EQ(crd["spec"]["group"].as<std::string>() + "/" + v["name"].as<std::string>(), std::string(kJobApiVersion));
  EXPECT_TRUE(v["served"].as<bool>());
  EXPECT_TRUE(v["storage"].as<bool>());
  EXPECT_TRUE(v["subresources"]["status"].IsMap());
  // `kubectl scale` resizes the workers; its status replicas are the elastic world's.
  EXPECT_EQ(v["subresources"]["scale"]["specReplicasPath"].as<std::string>(""), ".spec.workers.replicas");
  EXPECT_EQ(v["subresources"]["scale"]["statusReplicasPath"].as<std::string>(""), ".status.world.workers");
  std::set<std::string> columns;
  for (const auto& c : v["additionalPrinterColumns"]) {
    columns.insert(c["name"].as<std::string>() + "=" + c["jsonPath"].as<std::string>());
  }
  EXPECT_EQ(columns, (std::set<std::string>{"Phase=.status.phase", "Workers=.status.workers",
                                            "Servers=.status.servers", "Restarts=.status.restarts",
                                            "Checkpoint=.status.checkpoint.step",
                                            "Step=.status.progress.step",
                                            "Samples/s=.status.progress.samplesPerSecond",
                                            "ETA=.status.progress.eta",
                                            "Age=.metadata.creationTimestamp"}));
}

// apiextensions.k8s.io/v1 structural schema: every node has a type (or is int-or-string /
// preserve-unknown-fields), objects declare properties or preserve unknown fields, arrays have
// items, and anyOf branches carry no structure of their own.
void CheckStructural(const YAML::Node& s, const std::string& where) {
  SCOPED_TRACE(where);
  const bool int_or_string = s["x-kubernetes-int-or-string"] && s["x-kubernetes-int-or-string"].as<bool>();
  const bool preserve = s["x-kubernetes-preserve-unknown-fields"] && s["x-kubernetes-preserve-unknown-fields"].as<bool>();
  ASSERT_TRUE(s["type"] || int_or_string) << where << ": no type";
  if (int_or_string) {
    EXPECT_FALSE(s["type"]) << where;
    for (const auto& alt : s["anyOf"]) EXPECT_FALSE(alt["properties"] || alt["items"]) << where;
    return;
  }
  const std::string type = s["type"].as<std::string>();
  EXPECT_TRUE(type == "object" || type == "array" || type == "string" || type == "integer" || type == "number" ||
              type == "boolean")
      << where << ": type " << type;
  if (type == "object") {
    EXPECT_TRUE(s["properties"] || preserve || where == "metadata") << where << ": object without properties";
    for (const auto& kv : s["properties"]) CheckStructural(kv.second, where + "." + kv.first.as<std::string>());
  }
  if (type == "array") {
    ASSERT_TRUE(s["items"]) << where << ": array without items";
    CheckStructural(s["items"], where + "[]");
  }
  if (s["default"] && s["enum"]) {
    bool found = false;
    for (const auto& e : s["enum"]) found |= e.as<std::string>() == s["default"].as<std::string>();
    EXPECT_TRUE(found) << where << ": default not in enum";
  }
}

TEST(CrdTest, SchemaIsStructural) {
  YAML::Node root = Version()["schema"]["openAPIV3Schema"];
  EXPECT_EQ(root["type"].as<std::string>(), "object");
  for (const auto& kv : root["properties"]) CheckStructural(kv.second, kv.first.as<std::string>());
}

TEST(CrdTest, EveryFieldOfTheSchemaIsOneTheJobModelAccepts) {
  std::vector<Leaf> leaves;
  CollectLeaves(SpecSchema(), {}, leaves);
  ASSERT_GT(leaves.size(), 40u);
  for (const auto& leaf : leaves) {
    const auto samples = Samples(leaf);
    ASSERT_FALSE(samples.empty()) << Join(leaf.path) << ": no sample for its type";
    for (const auto& v : samples) {
      auto job = ParseJobSpec(LeafJob(leaf.path, v));
      EXPECT_TRUE(job.ok()) << Join(leaf.path) << " = " << v << ": " << job.status().message();
    }
  }
}

TEST(CrdTest, SchemaDefaultsAreTheJobModelsDefaults) {
  std::vector<Leaf> leaves;
  CollectLeaves(SpecSchema(), {}, leaves);
  auto base = ParseJobSpec(JobWith({"image"}, "x"));
  ASSERT_TRUE(base.ok());
  int checked = 0;
  for (const auto& leaf : leaves) {
    if (!leaf.schema["default"]) continue;
    if (leaf.path == std::vector<std::string>{"image"}) continue;
    auto job = ParseJobSpec(JobWith(leaf.path, leaf.schema["default"].as<std::string>()));
    ASSERT_TRUE(job.ok()) << Join(leaf.path) << ": " << job.status().message();
    job->image = "x";
    EXPECT_EQ(JobSpecToYaml(*job), JobSpecToYaml(*base)) << Join(leaf.path) << ": CRD default differs";
    ++checked;
  }
  EXPECT_GT(checked, 20);
}

TEST(CrdTest, EveryFieldOfTheFullExampleIsInTheSchema) {
  YAML::Node full = YAML::LoadFile(std::string(TRELLIS_SOURCE_DIR) + "/examples/jobs/full.yaml");
  std::function<void(const YAML::Node&, const YAML::Node&, const std::string&)> walk =
      [&](const YAML::Node& doc, const YAML::Node& schema, const std::string& where) {
        if (schema["x-kubernetes-preserve-unknown-fields"]) return;
        if (doc.IsMap()) {
          for (const auto& kv : doc) {
            const std::string k = kv.first.as<std::string>();
            ASSERT_TRUE(schema["properties"] && schema["properties"][k]) << where << "." << k << " is not in the CRD";
            walk(kv.second, schema["properties"][k], where + "." + k);
          }
        } else if (doc.IsSequence() && schema["items"]) {
          for (const auto& item : doc) walk(item, schema["items"], where + "[]");
        }
      };
  walk(full["spec"], SpecSchema(), "spec");
  // Both roles' fields, whichever example shows them.
  for (const char* role : {"servers", "workers"}) {
    for (const char* f : {"replicas", "command", "args", "env", "resources", "restartPolicy", "template"}) {
      EXPECT_TRUE(SpecSchema()["properties"][role]["properties"][f]) << role << "." << f;
    }
  }
  EXPECT_FALSE(SpecSchema()["properties"]["servers"]["properties"]["gpusPerWorker"]);  // workers only
}

TEST(CrdTest, EveryFieldTheJobModelWritesIsInTheSchema) {
  // JobSpecToYaml writes every field (defaults filled in); set the optional ones too. A field
  // missing from the CRD would be pruned by a real API server before the operator sees it.
  auto job = ParseJobSpec(JobWith({"runPolicy"}, "{activeDeadlineSeconds: 5, ttlSecondsAfterFinished: 5}"));
  ASSERT_TRUE(job.ok()) << job.status().message();
  job->image = "x";
  job->workers.restartPolicy = RestartPolicy::kNever;
  job->servers.restartPolicy = RestartPolicy::kNever;
  job->workers.env = {{"A", "b"}};
  job->workers.args = {"a"};
  job->workers.requests = {"1", "1Gi"};
  job->workers.limits = {"1", "1Gi"};
  // Not a valid combination (queue is Volcano's, the timeout coscheduling's), but every field.
  job->runPolicy.schedulingPolicy = {GangScheduler::kVolcano, "s", "q", "p", 5};
  YAML::Node doc = YAML::Load(JobSpecToYaml(*job));
  std::function<void(const YAML::Node&, const YAML::Node&, const std::string&)> walk =
      [&](const YAML::Node& d, const YAML::Node& schema, const std::string& where) {
        if (schema["x-kubernetes-preserve-unknown-fields"]) return;
        if (d.IsMap()) {
          for (const auto& kv : d) {
            const std::string k = kv.first.as<std::string>();
            ASSERT_TRUE(schema["properties"] && schema["properties"][k]) << where << "." << k << " is not in the CRD";
            walk(kv.second, schema["properties"][k], where + "." + k);
          }
        } else if (d.IsSequence() && schema["items"]) {
          for (const auto& item : d) walk(item, schema["items"], where + "[]");
        }
      };
  walk(doc["spec"], SpecSchema(), "spec");
}

TEST(CrdTest, SchemaRejectsWhatTheModelRejectsAtTheBounds) {
  // The bounds the schema states are the model's: one below each minimum is an error there too.
  std::vector<Leaf> leaves;
  CollectLeaves(SpecSchema(), {}, leaves);
  int checked = 0;
  for (const auto& leaf : leaves) {
    if (!leaf.schema["minimum"] || leaf.schema["type"].as<std::string>() != "integer") continue;
    const long below = leaf.schema["minimum"].as<long>() - 1;
    auto job = ParseJobSpec(LeafJob(leaf.path, std::to_string(below)));
    ASSERT_FALSE(job.ok()) << Join(leaf.path) << " = " << below;
    EXPECT_NE(job.status().message().find(Join(leaf.path) + ": must be >="), std::string::npos)
        << job.status().message();
    ++checked;
  }
  EXPECT_GE(checked, 8);
}

TEST(ManifestExamplesTest, EveryExampleTrainingJobValidates) {
  for (const char* f : {"mlp.yaml", "pytorch.yaml", "mlp-gang.yaml"}) {
    auto job = LoadJobSpecFile(std::string(TRELLIS_SOURCE_DIR) + "/manifests/examples/" + f);
    EXPECT_TRUE(job.ok()) << job.status().message();
  }
}

}  // namespace
}  // namespace trellis
