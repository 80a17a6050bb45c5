#include "operator/progress_poller.h"

#include <pthread.h>

#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include <cpprest/asyncrt_utils.h>

#include "common/base/logging.h"
#include "operator/events.h"
#include "operator/job_status.h"
#include "operator/progress_status.h"

namespace trellis::op {

ProgressPoller::ProgressPoller(KubeClient& client, OperatorSettings settings,
                               ProgressPollerOptions options, ObjectStore* jobs)
    : client_(client), settings_(std::move(settings)), options_(std::move(options)), jobs_(jobs) {}

ProgressPoller::~ProgressPoller() { Stop(); }

void ProgressPoller::Start() {
  MutexLock lock(&mu_);
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = std::thread([this] { Loop(); });
}

void ProgressPoller::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void ProgressPoller::Loop() {
  pthread_setname_np(pthread_self(), "progress");
  MutexLock lock(&mu_);
  while (!stopping_) {
    const auto next = std::chrono::steady_clock::now() + options_.interval;
    while (!stopping_) {
      if (!cv_.WaitUntil(&mu_, next)) break;
    }
    if (stopping_) break;
    lock.Unlock();
    PollOnce();
    lock.Lock();
  }
}

int ProgressPoller::PollOnce() {
  std::vector<Json> items;
  if (jobs_ && jobs_->usable()) {
    items = jobs_->List();
  } else if (jobs_) {
    return 0;  // the Controller has not listed the jobs yet
  } else {
    auto jobs = client_.List(kTrainingJobs, options_.watch_namespace);
    if (!jobs.ok()) {
      TLOG_WARN << "progress: cannot list TrainingJobs: " << jobs.status().message();
      return 0;
    }
    if (const Json* list = At(*jobs, {"items"}); list && list->is_array()) {
      for (size_t i = 0; i < list->size(); ++i) items.push_back(list->at(i));
    }
  }
  int writes = 0;
  std::set<Key> running;
  std::set<std::string> uids;
  for (const Json& job : items) {
    uids.insert(Str(job, {"metadata", "uid"}));
    if (Str(job, {"status", "phase"}) != kRunning) continue;
    const Key key{Str(job, {"metadata", "namespace"}, "default"), Str(job, {"metadata", "name"})};
    running.insert(key);
    auto r = PollJob(job);
    if (!r.ok()) {
      TLOG_DEBUG << "progress of " << key.first << "/" << key.second << ": " << r.status().message();
    } else if (*r) {
      ++writes;
    }
  }
  // Connections of jobs that ended or went away.
  for (auto it = schedulers_.begin(); it != schedulers_.end();) {
    it = running.count(it->first) ? std::next(it) : schedulers_.erase(it);
  }
  for (auto it = restarts_seen_.begin(); it != restarts_seen_.end();) {
    it = uids.count(it->first) ? std::next(it) : restarts_seen_.erase(it);
  }
  return writes;
}

StatusOr<std::string> ProgressPoller::SchedulerAddress(const std::string& ns,
                                                       const std::string& name) const {
  const std::string service = ServiceName(name) + ":" + std::to_string(settings_.scheduler_port);
  if (options_.scheduler_addresses_file.empty()) {
    return ServiceName(name) + "." + ns + ".svc:" + std::to_string(settings_.scheduler_port);
  }
  std::ifstream in(options_.scheduler_addresses_file);
  if (!in) return NotFoundError(options_.scheduler_addresses_file + ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  std::string error;
  auto map = ParseJson(text.str(), &error);
  if (!map) return InvalidArgumentError(options_.scheduler_addresses_file + ": " + error);
  std::string addr = Str(*map, {(ns + "/" + service).c_str()});
  if (addr.empty()) return NotFoundError("no address for " + ns + "/" + service);
  return addr;
}

StatusOr<SchedulerClient*> ProgressPoller::ClientFor(const std::string& ns, const std::string& name,
                                                     const std::string& uid,
                                                     const std::string& tls_secret,
                                                     const std::string& server_name) {
  TRELLIS_ASSIGN_OR_RETURN(std::string address, SchedulerAddress(ns, name));
  Scheduler& s = schedulers_[{ns, name}];
  if (s.client && s.uid == uid && s.address == address) return s.client.get();
  TRELLIS_ASSIGN_OR_RETURN(Json secret, client_.Get(kSecrets, ns, TokenSecretName(name)));
  std::string token = Str(secret, {"stringData", "token"});
  if (token.empty()) {
    const std::string b64 = Str(secret, {"data", "token"});
    try {
      const std::vector<unsigned char> raw = utility::conversions::from_base64(b64);
      token.assign(raw.begin(), raw.end());
    } catch (const std::exception& e) {
      return InvalidArgumentError("secret " + TokenSecretName(name) + ": bad base64: " + e.what());
    }
  }
  if (token.empty()) return NotFoundError("secret " + TokenSecretName(name) + " holds no token");
  SchedulerClientOptions o;
  o.address = address;
  o.token = token;
  o.rpc_timeout = std::chrono::milliseconds(2000);  // one slow job must not hold up the others
  if (!tls_secret.empty()) {
    // A TLS job's scheduler takes only clients with the job's certificate: the operator presents
    // the one in the job's Secret, as its pods do.
    TRELLIS_ASSIGN_OR_RETURN(Json certs, client_.Get(kSecrets, ns, tls_secret));
    std::string pem[3];
    const char* keys[3] = {"ca.crt", "tls.crt", "tls.key"};
    for (int i = 0; i < 3; ++i) {
      try {
        const std::vector<unsigned char> raw =
            utility::conversions::from_base64(Str(certs, {"data", keys[i]}));
        pem[i].assign(raw.begin(), raw.end());
      } catch (const std::exception& e) {
        return InvalidArgumentError("secret " + tls_secret + ": " + keys[i] + ": bad base64: " +
                                    e.what());
      }
      if (pem[i].empty()) return NotFoundError("secret " + tls_secret + " holds no " + keys[i]);
    }
    auto tls = LoadTlsPem(pem[0], pem[1], pem[2], server_name.empty() ? "trellis" : server_name);
    if (!tls.ok()) return tls.status().Annotate("secret " + tls_secret);
    o.tls = *tls;
  }
  TRELLIS_ASSIGN_OR_RETURN(s.client, SchedulerClient::Connect(o));
  s.uid = uid;
  s.address = address;
  return s.client.get();
}

StatusOr<bool> ProgressPoller::PollJob(const Json& job) {
  const std::string ns = Str(job, {"metadata", "namespace"}, "default");
  const std::string name = Str(job, {"metadata", "name"});
  TRELLIS_ASSIGN_OR_RETURN(SchedulerClient * c,
                           ClientFor(ns, name, Str(job, {"metadata", "uid"}),
                                     Str(job, {"spec", "tls", "secretName"}),
                                     Str(job, {"spec", "tls", "serverName"})));
  auto progress = c->GetProgress();
  if (!progress.ok()) {
    schedulers_.erase({ns, name});  // reconnect next round (a restarted scheduler, a new token)
    return progress.status();
  }
  const Json before = *At(job, {"status"});
  Json status = before;
  ApplyProgress(status, *progress, Clock::now());
  // The programs' restarts inside their pods: the scheduler counts what the agents report.
  const std::string uid = Str(job, {"metadata", "uid"});
  ProgramRestartsSeen seen = restarts_seen_[uid];  // kept once the status carries them
  std::vector<std::string> restarted;
  auto view = c->GetCluster(0, /*wait_complete=*/false, std::chrono::milliseconds(2000));
  if (view.ok()) {
    restarted = ApplyProgramRestarts(status, *view, seen);
  } else {
    TLOG_DEBUG << "cluster view of " << ns << "/" << name << ": " << view.status().message();
  }
  if (status == before) {
    restarts_seen_[uid] = seen;
    return false;
  }
  Json update = job;
  update["status"] = status;
  auto w = client_.UpdateStatus(kTrainingJobs, ns, name, update);
  if (!w.ok()) return w.status();  // a 409 waits for the next round, with a fresh read
  if (jobs_) jobs_->Written(*w);
  restarts_seen_[uid] = seen;
  for (const auto& m : restarted) {
    Status e = RecordJobEvent(client_, *w, "Warning", "ProgramRestarted", "job " + name + ": " + m, Clock::now());
    if (!e.ok()) TLOG_WARN << "job " << ns << "/" << name << ": cannot record event: " << e.message();
  }
  return true;
}

}  // namespace trellis::op
