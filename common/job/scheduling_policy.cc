#include "common/job/scheduling_policy.h"

#include "common/base/text_match.h"

#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace trellis {
namespace {

const std::vector<std::pair<std::string_view, GangScheduler>>& GangSchedulerNames() {
  static const std::vector<std::pair<std::string_view, GangScheduler>> n = {
      {"volcano", GangScheduler::kVolcano}, {"scheduler-plugins", GangScheduler::kSchedulerPlugins}};
  return n;
}

// Scheduler, PriorityClass and Volcano Queue names are Kubernetes object names: DNS-1123
// subdomains. Checked here so a typo fails at parse time, not as a pod the API server refuses.
using text::IsDns1123Subdomain;

void NameField(const yaml::MapReader& m, std::string_view key, std::string* out) {
  std::string v;
  if (!m.GetString(key, &v)) return;
  if (!IsDns1123Subdomain(v)) {
    m.errors()->AddGot(m.Path(key),
                       "must be a Kubernetes object name (DNS-1123 subdomain: lower-case letters, "
                       "digits, '-' and '.', at most 253 characters)",
                       m.Get(key));
    return;
  }
  *out = v;
}

}  // namespace

std::string_view ToString(GangScheduler v) {
  for (const auto& [name, value] : GangSchedulerNames()) {
    if (value == v) return name;
  }
  return "unknown";
}

std::optional<GangScheduler> ParseGangScheduler(std::string_view s) {
  for (const auto& [name, value] : GangSchedulerNames()) {
    if (name == s) return value;
  }
  return std::nullopt;
}

void ParseSchedulingPolicy(const yaml::MapReader& run, SchedulingPolicySpec* out) {
  // minAvailable and minResources are Kubeflow's fields: named, so a migrating user learns why.
  yaml::MapReader p(run.Get("schedulingPolicy"), run.Path("schedulingPolicy"), run.errors(),
                    {"gangScheduler", "schedulerName", "queue", "priorityClass", "scheduleTimeoutSeconds"},
                    {"minAvailable", "minResources"});
  yaml::Errors* errors = run.errors();
  for (std::string_view key : {"minAvailable", "minResources"}) {
    if (p.Has(key)) {
      errors->AddGot(p.Path(key),
                     "is not supported: every pod of a Trellis job must run at once, so the gang "
                     "is always the whole job (minMember = 1 + servers + workers)",
                     p.Get(key));
    }
  }
  GangScheduler gang;
  if (p.GetEnum("gangScheduler", GangSchedulerNames(), &gang)) out->gangScheduler = gang;
  NameField(p, "schedulerName", &out->schedulerName);
  NameField(p, "priorityClass", &out->priorityClass);

  std::string queue;
  if (p.Has("queue")) {
    if (out->gangScheduler != GangScheduler::kVolcano) {
      errors->AddGot(p.Path("queue"), "is a Volcano queue: only allowed with gangScheduler volcano",
                     p.Get("queue"));
    } else {
      NameField(p, "queue", &out->queue);
    }
  }
  if (p.Has("scheduleTimeoutSeconds")) {
    int64_t v = 0;
    if (out->gangScheduler != GangScheduler::kSchedulerPlugins) {
      errors->AddGot(p.Path("scheduleTimeoutSeconds"), "only allowed with gangScheduler scheduler-plugins",
                     p.Get("scheduleTimeoutSeconds"));
    } else if (p.GetInt("scheduleTimeoutSeconds", &v)) {
      if (v < 1) {
        errors->AddGot(p.Path("scheduleTimeoutSeconds"), "must be >= 1", p.Get("scheduleTimeoutSeconds"));
      } else if (v > std::numeric_limits<int32_t>::max()) {
        errors->AddGot(p.Path("scheduleTimeoutSeconds"), "must be <= 2147483647",
                       p.Get("scheduleTimeoutSeconds"));
      } else {
        out->scheduleTimeoutSeconds = static_cast<int32_t>(v);
      }
    }
  }
}

}  // namespace trellis
