// The operator's watch-fed cache (operator/object_cache.h): what a LIST, the watch events and the
// operator's own writes leave in it, and what it keeps of each object.
#include "operator/object_cache.h"

#include <gtest/gtest.h>

#include "operator/desired.h"

namespace trellis::op {
namespace {

Json Obj(const std::string& text) {
  auto j = ParseJson(text);
  EXPECT_TRUE(j.has_value()) << text;
  return j.value_or(Json::object());
}

Json Pod(const std::string& ns, const std::string& name, const std::string& job, const std::string& rv,
         const std::string& phase = "Pending") {
  return Obj(R"({"kind":"Pod","metadata":{"namespace":")" + ns + R"(","name":")" + name +
             R"(","resourceVersion":")" + rv + R"(","labels":{"trellis.io/job-name":")" + job +
             R"("},"managedFields":[{"manager":"kubectl","fieldsV1":{"f:spec":{}}}]},)" +
             R"("spec":{"containers":[{"name":"trellis"}]},"status":{"phase":")" + phase + R"("}})");
}

std::vector<std::string> Names(const std::vector<Json>& objs) {
  std::vector<std::string> out;
  for (const Json& o : objs) out.push_back(Str(o, {"metadata", "name"}));
  return out;
}

TEST(OlderVersionTest, ComparesDecimalRevisionsAndTreatsOthersAsNotOlder) {
  EXPECT_TRUE(OlderVersion("99", "100"));  // as numbers, not as text
  EXPECT_FALSE(OlderVersion("100", "99"));
  EXPECT_FALSE(OlderVersion("100", "100"));
  EXPECT_FALSE(OlderVersion("", "5"));
  EXPECT_FALSE(OlderVersion("abc", "5"));
  EXPECT_FALSE(OlderVersion("5", "x7"));
}

TEST(ObjectStoreTest, ListThenEventsKeepTheStoreAsTheServerHasIt) {
  ObjectStore pods(ObjectStore::Options{false, {}, kLabelJob});
  EXPECT_FALSE(pods.synced());
  EXPECT_FALSE(pods.usable());
  Json items = Json::array();
  items[0] = Pod("a", "mlp-worker-0", "mlp", "10");
  items[1] = Pod("a", "mlp-worker-1", "mlp", "11");
  items[2] = Pod("b", "mlp-worker-0", "mlp", "12");  // another namespace's job of the same name
  Json list = Json::object();
  list["apiVersion"] = JStr("v1");
  list["kind"] = JStr("PodList");
  list["items"] = items;
  pods.Replace(list);
  pods.MarkSynced();
  // A LIST's items come without apiVersion and kind; the store gives them the list's.
  EXPECT_EQ(Str(*pods.Get("b", "mlp-worker-0"), {"apiVersion"}), "v1");
  EXPECT_EQ(Str(*pods.Get("a", "mlp-worker-1"), {"kind"}), "Pod");
  EXPECT_TRUE(pods.usable());
  EXPECT_EQ(pods.size(), 3u);
  EXPECT_EQ(Names(pods.ListByLabel("a", "mlp")), (std::vector<std::string>{"mlp-worker-0", "mlp-worker-1"}));
  EXPECT_EQ(Names(pods.ListByLabel("b", "mlp")), (std::vector<std::string>{"mlp-worker-0"}));
  EXPECT_TRUE(pods.ListByLabel("a", "other").empty());

  pods.Apply("MODIFIED", Pod("a", "mlp-worker-0", "mlp", "20", "Running"));
  EXPECT_EQ(Str(*pods.Get("a", "mlp-worker-0"), {"status", "phase"}), "Running");
  pods.Apply("DELETED", Pod("a", "mlp-worker-1", "mlp", "21"));
  EXPECT_FALSE(pods.Get("a", "mlp-worker-1").has_value());
  EXPECT_EQ(Names(pods.ListByLabel("a", "mlp")), (std::vector<std::string>{"mlp-worker-0"}));
  pods.Apply("BOOKMARK", Pod("a", "ignored", "mlp", "22"));
  pods.Apply("ADDED", Obj(R"({"metadata":{"namespace":"a"}})"));  // no name: not stored
  EXPECT_EQ(pods.size(), 2u);

  // A relabelled object moves in the index.
  pods.Apply("MODIFIED", Pod("a", "mlp-worker-0", "other", "23"));
  EXPECT_TRUE(pods.ListByLabel("a", "mlp").empty());
  EXPECT_EQ(Names(pods.ListByLabel("a", "other")), (std::vector<std::string>{"mlp-worker-0"}));

  // A relist (after 410 Gone) forgets what went meanwhile.
  Json again = Json::array();
  again[0] = Pod("b", "mlp-worker-0", "mlp", "30");
  list["items"] = again;
  pods.Replace(list);
  EXPECT_EQ(pods.size(), 1u);
  EXPECT_TRUE(pods.ListByLabel("a", "other").empty());
  EXPECT_EQ(Str(*pods.Get("b", "mlp-worker-0"), {"metadata", "resourceVersion"}), "30");
}

TEST(ObjectStoreTest, OwnWritesGoInUnlessTheWatchAlreadyBroughtANewerVersion) {
  ObjectStore jobs;
  jobs.Apply("ADDED", Pod("a", "mlp", "mlp", "100"));
  // The status write's answer: newer than what the watch has shown so far.
  jobs.Written(Pod("a", "mlp", "mlp", "105", "Running"));
  EXPECT_EQ(Str(*jobs.Get("a", "mlp"), {"status", "phase"}), "Running");
  // The watch was faster: its newer version stays.
  jobs.Apply("MODIFIED", Pod("a", "mlp", "mlp", "110", "Succeeded"));
  jobs.Written(Pod("a", "mlp", "mlp", "107", "Running"));
  EXPECT_EQ(Str(*jobs.Get("a", "mlp"), {"status", "phase"}), "Succeeded");
  EXPECT_EQ(Str(*jobs.Get("a", "mlp"), {"metadata", "resourceVersion"}), "110");
  // A created object the watch has not shown yet.
  jobs.Written(Pod("a", "new", "new", "111"));
  EXPECT_TRUE(jobs.Get("a", "new").has_value());
}

TEST(ObjectStoreTest, KeepsWhatTheOperatorReadsAndDropsTheRest) {
  ObjectStore pods;
  pods.Apply("ADDED", Pod("a", "p", "mlp", "1"));
  const Json p = *pods.Get("a", "p");
  EXPECT_EQ(At(p, {"metadata", "managedFields"}), nullptr);  // nobody reads it; most of the size
  EXPECT_NE(At(p, {"spec", "containers"}), nullptr);
  EXPECT_EQ(Str(p, {"status", "phase"}), "Pending");
  // Objects without those fields (most of what a watch brings) are kept as they are.
  pods.Apply("ADDED", Obj(R"({"metadata":{"namespace":"a","name":"bare","annotations":{"x":"y"}}})"));
  pods.Written(Obj(R"({"metadata":{"namespace":"a","name":"bare2"}})"));
  EXPECT_EQ(Str(*pods.Get("a", "bare"), {"metadata", "annotations", "x"}), "y");
  EXPECT_TRUE(pods.Get("a", "bare2").has_value());

  // Secrets: that they exist and whose they are, never their data.
  ObjectCache cache;
  cache.secrets.Apply("ADDED", Obj(R"({"kind":"Secret","metadata":{"namespace":"a","name":"mlp-token","uid":"u1",
      "resourceVersion":"3","labels":{"trellis.io/job-name":"mlp"},"ownerReferences":[{"uid":"job-uid"}]},
      "data":{"token":"c2VjcmV0"},"stringData":{"token":"secret"}})"));
  const Json s = *cache.secrets.Get("a", "mlp-token");
  EXPECT_EQ(At(s, {"data"}), nullptr);
  EXPECT_EQ(At(s, {"stringData"}), nullptr);
  EXPECT_EQ(Str(s, {"metadata", "uid"}), "u1");
  EXPECT_EQ(Str(s, {"metadata", "labels", kLabelJob}), "mlp");
  EXPECT_EQ(Str(s, {"metadata", "resourceVersion"}), "3");
  EXPECT_NE(At(s, {"metadata", "ownerReferences"}), nullptr);
  EXPECT_EQ(Names(cache.secrets.ListByLabel("a", "mlp")), (std::vector<std::string>{"mlp-token"}));

  // ConfigMaps: the job file is compared with the spec, so their data stays.
  cache.configmaps.Apply("ADDED", Obj(R"({"kind":"ConfigMap","metadata":{"namespace":"a","name":"mlp-config",
      "managedFields":[{}]},"data":{"job.yaml":"x: 1"}})"));
  EXPECT_EQ(Str(*cache.configmaps.Get("a", "mlp-config"), {"data", "job.yaml"}), "x: 1");
  EXPECT_EQ(At(*cache.configmaps.Get("a", "mlp-config"), {"metadata", "managedFields"}), nullptr);
}

TEST(ObjectStoreTest, ADisabledStoreIsSyncedButNotUsable) {
  ObjectCache cache;
  EXPECT_FALSE(cache.synced());
  for (ObjectStore* s : {&cache.jobs, &cache.pods, &cache.services, &cache.configmaps}) s->MarkSynced();
  EXPECT_FALSE(cache.synced());
  cache.secrets.Disable();  // its watch is not permitted: the reconciler reads from the server
  EXPECT_TRUE(cache.synced());
  EXPECT_FALSE(cache.secrets.usable());
  EXPECT_TRUE(cache.pods.usable());
}

}  // namespace
}  // namespace trellis::op
