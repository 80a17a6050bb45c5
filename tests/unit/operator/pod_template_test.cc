#include "operator/pod_template.h"

#include <gtest/gtest.h>

#include "operator/desired.h"
#include "tests/unit/operator/test_jobs.h"

namespace trellis::op {
namespace {

TEST(YamlToJsonTest, PlainScalarsAreTypedQuotedStayStrings) {
  auto j = YamlToJson("a: 1\nb: '1'\nc: true\nd: \"true\"\ne: 0.5\nf: ~\ng: [x, 2]\nh: text\n");
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j->at("a"), Json::number(1));
  EXPECT_EQ(j->at("b"), JStr("1"));
  EXPECT_EQ(j->at("c"), Json::boolean(true));
  EXPECT_EQ(j->at("d"), JStr("true"));
  EXPECT_EQ(j->at("e"), Json::number(0.5));
  EXPECT_TRUE(j->at("f").is_null());
  EXPECT_EQ(j->at("g").at(1), Json::number(2));
  EXPECT_EQ(j->at("h"), JStr("text"));
  EXPECT_FALSE(YamlToJson("a: [1").ok());
}

TEST(PodTemplateTest, TemplateIsTheBaseAndTheOperatorsFieldsWin) {
  Json job = testing::ApiJob(R"({"workers":{"command":["w"],"env":[{"name":"MINE","value":"1"}],
    "template":{"metadata":{"labels":{"pool":"gpu","trellis.io/role":"evil"},"annotations":{"a":"b"}},
      "spec":{"nodeSelector":{"pool":"training"},"tolerations":[{"key":"gpu","operator":"Exists"}],
              "restartPolicy":"Always","priorityClassName":"high",
              "containers":[{"name":"trellis","image":"other:1","env":[{"name":"MINE","value":"2"},
                              {"name":"EXTRA","value":"x"}],"volumeMounts":[{"name":"data","mountPath":"/data"}],
                             "securityContext":{"runAsUser":1000}},
                            {"name":"sidecar","image":"log:1"}],
              "volumes":[{"name":"data","emptyDir":{}},{"name":"token","emptyDir":{}}]}}}})");
  JobSpec spec = testing::Spec(job);
  Json pod = RolePod(*JobMetaOf(job), spec, PodRole::kWorker, 0, OperatorSettings{});
  EXPECT_EQ(Str(pod, {"metadata", "labels", "pool"}), "gpu");
  EXPECT_EQ(Str(pod, {"metadata", "labels", "trellis.io/role"}), "worker");  // ours win
  EXPECT_EQ(Str(pod, {"metadata", "annotations", "a"}), "b");
  EXPECT_EQ(Str(pod, {"metadata", "annotations", "prometheus.io/scrape"}), "true");
  EXPECT_EQ(Str(pod, {"spec", "nodeSelector", "pool"}), "training");
  EXPECT_EQ(Str(pod, {"spec", "priorityClassName"}), "high");
  EXPECT_EQ(pod.at("spec").at("tolerations").size(), 1u);
  EXPECT_EQ(Str(pod, {"spec", "restartPolicy"}), "Never");  // the operator restarts pods
  const Json& containers = pod.at("spec").at("containers");
  ASSERT_EQ(containers.size(), 2u);
  const Json& c = containers.at(0);
  EXPECT_EQ(Str(c, {"name"}), "trellis");
  EXPECT_EQ(Str(c, {"image"}), OperatorSettings{}.default_image);  // ours win
  EXPECT_EQ(Int(c, {"securityContext", "runAsUser"}), 1000);       // the template's extra field kept
  EXPECT_EQ(c.at("command").at(0).as_string(), "trellis-agent");
  std::map<std::string, std::string> env;
  for (size_t i = 0; i < c.at("env").size(); ++i) env[Str(c.at("env").at(i), {"name"})] = Str(c.at("env").at(i), {"value"});
  EXPECT_EQ(env["MINE"], "1");
  EXPECT_EQ(env["EXTRA"], "x");
  EXPECT_EQ(env["TRELLIS_ROLE"], "worker");
  EXPECT_EQ(c.at("volumeMounts").size(), 2u);  // token + data
  EXPECT_EQ(Str(containers.at(1), {"name"}), "sidecar");
  const Json& vols = pod.at("spec").at("volumes");
  ASSERT_EQ(vols.size(), 2u);  // token (ours; the template's same-named one dropped) + data
  EXPECT_EQ(Str(vols.at(0), {"secret", "secretName"}), "mlp-token");
  EXPECT_EQ(Str(vols.at(1), {"name"}), "data");
}

// The documented minimal use (a node pool): no containers, no volumes. It used to abort the
// operator with cpprestsdk's "Key not found".
TEST(PodTemplateTest, TemplateWithOnlyANodeSelector) {
  Json job = testing::ApiJob(R"({"workers":{"command":["w"],"template":{"spec":{"nodeSelector":{"pool":"a100"}}}}})");
  Json pod = RolePod(*JobMetaOf(job), testing::Spec(job), PodRole::kWorker, 0, OperatorSettings{});
  EXPECT_EQ(Str(pod, {"spec", "nodeSelector", "pool"}), "a100");
  ASSERT_EQ(pod.at("spec").at("containers").size(), 1u);
  EXPECT_EQ(Str(pod.at("spec").at("containers").at(0), {"name"}), "trellis");
  EXPECT_EQ(pod.at("spec").at("volumes").size(), 1u);
  // Wrong types where lists belong are ignored, not thrown on.
  auto odd = ApplyPodTemplate(pod, "spec: {containers: 3, volumes: {a: 1}}\nmetadata: {labels: [1]}\n");
  ASSERT_TRUE(odd.ok()) << odd.status().message();
  EXPECT_EQ(odd->at("spec").at("containers").size(), 1u);
}

TEST(PodTemplateTest, NoTemplateLeavesThePodAlone) {
  Json pod = *ParseJson(R"({"metadata":{"name":"p"},"spec":{"containers":[{"name":"trellis"}]}})");
  auto out = ApplyPodTemplate(pod, "");
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, pod);
  EXPECT_FALSE(ApplyPodTemplate(pod, "[1, 2]").ok());
}

}  // namespace
}  // namespace trellis::op
