#include "worker-lib/src/scheduler_session.h"

#include <algorithm>
#include <thread>

#include "common/base/logging.h"

namespace trellis {

using std::chrono::milliseconds;

StatusOr<std::shared_ptr<SchedulerSession>> SchedulerSession::Start(
    std::shared_ptr<SchedulerClient> client, int32_t rank, int64_t incarnation,
    milliseconds ping_interval) {
  TRELLIS_ASSIGN_OR_RETURN(v1::PingResponse ping, client->Ping());
  std::shared_ptr<SchedulerSession> s(new SchedulerSession(std::move(client), rank, incarnation));
  SchedulerSession* self = s.get();
  // Its pings name it: this program's own liveness (docs/scheduler.md#stalls).
  v1::PingRequest identity;
  identity.set_role(v1::ROLE_WORKER);
  identity.set_rank(rank);
  identity.set_incarnation(incarnation);
  s->watch_ = std::make_unique<SchedulerWatch>(
      s->client_.get(), ping.scheduler_id(), ping_interval, [self] { return self->HandBack(); },
      "worker " + std::to_string(rank), identity);
  return s;
}

SchedulerSession::SchedulerSession(std::shared_ptr<SchedulerClient> client, int32_t rank,
                                   int64_t incarnation)
    : client_(std::move(client)), rank_(rank), incarnation_(incarnation) {}

SchedulerSession::~SchedulerSession() { watch_.reset(); }

void SchedulerSession::AwaitScheduler(milliseconds left) {
  const auto start = std::chrono::steady_clock::now();
  watch_->WaitUp(left);
  const auto spent = std::chrono::steady_clock::now() - start;
  std::this_thread::sleep_for(
      std::max(milliseconds(0), std::min(left, milliseconds(200)) -
                                    std::chrono::duration_cast<milliseconds>(spent)));
}

void SchedulerSession::HoldShardMap(const v1::ShardMap& map) {
  MutexLock lock(&mu_);
  map_ = map;
}

void SchedulerSession::HoldServerAddresses(const std::vector<std::string>& addresses) {
  MutexLock lock(&mu_);
  addresses_ = addresses;
}

void SchedulerSession::HoldServerAddress(int32_t server, const std::string& address) {
  MutexLock lock(&mu_);
  if (server >= 0 && static_cast<size_t>(server) < addresses_.size()) {
    addresses_[static_cast<size_t>(server)] = address;
  }
}

void SchedulerSession::HoldWorld(std::function<v1::WorldInfo()> world) {
  MutexLock lock(&mu_);
  world_ = std::move(world);
}

Status SchedulerSession::HandBack() {
  v1::ResumeRequest req;
  req.set_rank(rank_);
  req.set_incarnation(incarnation_);
  std::function<v1::WorldInfo()> world;
  {
    MutexLock lock(&mu_);
    if (map_) *req.mutable_shard_map() = *map_;
    for (const auto& a : addresses_) req.add_server_addresses(a);
    world = world_;
  }
  if (world) *req.mutable_world() = world();  // outside mu_: the world has its own lock
  auto resp = client_->Resume(req);
  if (!resp.ok()) return resp.status();
  TLOG_INFO << "worker " << rank_ << ": handed back "
            << (req.has_shard_map() ? "the shard map (" + std::to_string(req.shard_map().keys_size()) + " keys) and "
                                    : std::string("no shard map (none yet) and "))
            << req.server_addresses_size() << " server addresses to the restarted scheduler";
  return Status::Ok();
}

}  // namespace trellis
