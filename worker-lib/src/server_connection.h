// The worker's connection to one parameter server: one concrete class over one link at a time
// (datapath/link.h, opened through datapath/connect.h over the job's spec.transport). It numbers
// requests and routes answers (PendingAnswers, one table per link), lets a pull's payload land
// straight in the caller's `out` under the operation's data lock, and fails what is pending when
// the link ends.
//
// With recovery on (the job's spec.recovery.retainPushes; docs/checkpoints.md, "Crash recovery:
// servers") the connection outlives its server's process. It
//  * retains, per slice, the worker's last two pushes as the request bytes that went out (a
//    float32 copy, or the 2-bit frame as sent), so that a restarted server can rebuild;
//  * when the link ends (UNAVAILABLE: EOF, reset, stream error), holds the requests that were
//    not answered and those sent meanwhile instead of failing them, and opens a new link with
//    back-off: re-resolving the server's address (the scheduler's cluster view), re-installing
//    the last shard map, replaying the retained pushes (wire::Op::kReplay) and ending them;
//  * then re-sends what it held: a push the replay covered is answered at once (a pushpull
//    becomes the pull of its step), everything else goes out again.
// The whole recovery is bounded by ConnectionOptions::timeout_ms from the moment the link ended;
// after that every held request, and every later one, fails with UNAVAILABLE naming the server,
// what was tried and the last error (the worker adds key, slice and step).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <prometheus/counter.h>

#include "common/base/mutex.h"
#include "common/base/status.h"
#include "datapath/connect.h"
#include "datapath/link.h"
#include "trellis/v1/scheduler.pb.h"
#include "worker-lib/src/transport.h"

namespace trellis {

// One link to a server and the control calls beside it (DataService.InstallShardMap and
// HandOver, always gRPC). The seam a test fakes: a WorkerLink of its own and an install that
// succeeds.
struct ServerLink {
  std::unique_ptr<link::WorkerLink> link;  // not started yet
  std::function<Status(const v1::ShardMap& map, int32_t server_rank, int64_t timeout_ms)>
      install_map;
  // A handover request frame (datapath/handover.h) -> the answer's payload. Null: none.
  std::function<StatusOr<std::string>(const std::string& frame, int64_t timeout_ms)> hand_over;
};
using LinkOpener = std::function<StatusOr<ServerLink>(const ConnectionOptions&)>;
// A link of `transport` (datapath/connect.h). TCP: fails without a TCP port in the address
// (INVALID_ARGUMENT: the server advertised none) and when the hello is refused.
StatusOr<ServerLink> OpenLink(link::Transport transport, const ConnectionOptions& options);
// "grpc" or "tcp" -> OpenLink over it; anything else is INVALID_ARGUMENT naming the choices.
StatusOr<LinkOpener> TransportByName(const std::string& name);

struct RecoveryOptions {
  int32_t server_rank = 0;
  // The server's current data address (datapath/address.h), waiting at most `wait_ms` for the
  // cluster to be complete again; null: the address does not change.
  std::function<StatusOr<std::string>(int32_t server, int64_t wait_ms)> resolve;
  // Bounds one attempt (resolve, connect, shard map, replays), within the overall timeout.
  int64_t attempt_timeout_ms = 3000;
  // When the scheduler last said a member of the job is being restarted (a stalled server its
  // agent kills and restarts, docs/scheduler.md#stalls); null: never. The recovery gives up only
  // one timeout after that, not while the server is still being restarted.
  std::function<std::chrono::steady_clock::time_point()> restarting_seen_at;
  prometheus::Counter* reconnects = nullptr;  // trellis_worker_server_reconnects_total
  prometheus::Counter* replayed = nullptr;    // trellis_worker_replayed_slices_total
  // Elastic jobs: the world this worker is in (epoch, members). A world after the first is
  // announced (wire::Op::kWorld) before the replays, so a restarted server, which starts from
  // the job's first world, rebuilds and counts in the world the workers are in. Null: never.
  std::function<std::pair<int64_t, std::vector<int32_t>>()> world;
};

class ServerConnection {
 public:
  // Opens the first link with `open`. `recovery` absent: nothing is retained, and once the link
  // ended every request fails with its error.
  static StatusOr<std::unique_ptr<ServerConnection>> Open(const ConnectionOptions& options,
                                                         LinkOpener open,
                                                         std::optional<RecoveryOptions> recovery);
  // Closing fails the requests still pending or held with CANCELLED.
  ~ServerConnection();
  ServerConnection(const ServerConnection&) = delete;
  ServerConnection& operator=(const ServerConnection&) = delete;

  const std::string& address() const { return options_.address.service; }
  // Hands the slice's shard map to the server (control call, bounded by `timeout_ms`); with
  // recovery on, also to every later link.
  Status InstallShardMap(const v1::ShardMap& map, int32_t server_rank, int64_t timeout_ms)
      EXCLUDES(mu_);
  // A server resize: one handout or handin request frame (control call, bounded by
  // `timeout_ms`); returns the answer's payload.
  StatusOr<std::string> HandOver(const std::string& frame, int64_t timeout_ms) EXCLUDES(mu_);
  // Queues one request; never blocks on the network.
  void Send(const SliceRequest& request, SliceReply reply, SliceSent sent) EXCLUDES(mu_);
  void Send(const SliceRequest& request, SliceReply reply) {
    Send(request, std::move(reply), nullptr);
  }
  // Several small requests in one bulk frame (wire::ParseBulk): `replies[i]` answers
  // `requests[i]` exactly as Send's reply would; `sent` runs once for the whole frame.
  // REQUIRES: requests.size() == replies.size() >= 1; no kInit request.
  void SendBulk(const std::vector<SliceRequest>& requests, std::vector<SliceReply> replies,
                SliceSent sent) EXCLUDES(mu_);

 private:
  class LinkSession;  // one link and its pending requests (server_connection.cc)
  struct SentOnce;  // a request's `sent`, run once over all the links it travelled on
  struct Held {
    SliceRequest request;
    SliceReply reply;
    std::shared_ptr<SentOnce> sent;
  };
  enum class State { kUp, kReconnecting, kFailed };
  using SliceId = std::pair<uint64_t, uint32_t>;
  using PushId = std::tuple<uint64_t, uint32_t, int64_t>;  // key, slice, step
  struct Retained {
    int64_t step;
    std::shared_ptr<std::vector<uint8_t>> bytes;  // a replay's `encoded` while it is sent
  };

  ServerConnection(const ConnectionOptions& options, LinkOpener open,
                   std::optional<RecoveryOptions> recovery, std::shared_ptr<LinkSession> first);

  void Retain(const SliceRequest& r) EXCLUDES(mu_);
  void Forward(Held h) EXCLUDES(mu_);
  SliceReply WrapReply(std::shared_ptr<Held> h, uint64_t gen);
  void StartReconnectLocked(const Status& cause) REQUIRES(mu_);
  void Resume(Held h) EXCLUDES(mu_);
  void ReconnectLoop() EXCLUDES(mu_);
  std::shared_ptr<LinkSession> Recover(std::set<PushId>* replayed, Status* fatal) EXCLUDES(mu_);
  std::shared_ptr<LinkSession> Attempt(std::chrono::steady_clock::time_point end,
                                       std::set<PushId>* replayed, Status* last) EXCLUDES(mu_);
  void Retire(std::shared_ptr<LinkSession> session) EXCLUDES(mu_);

  const ConnectionOptions options_;
  const LinkOpener open_;
  const bool recovering_;
  const RecoveryOptions recovery_;  // defaults when !recovering_

  Mutex mu_;
  CondVar cv_;  // the reconnect thread: work, or closing
  std::shared_ptr<LinkSession> session_ GUARDED_BY(mu_);  // the current link
  // Links replaced or given up on; destroyed last, never from one of their own callbacks.
  std::vector<std::shared_ptr<LinkSession>> retired_ GUARDED_BY(mu_);
  uint64_t generation_ GUARDED_BY(mu_) = 0;  // bumped per new link
  State state_ GUARDED_BY(mu_) = State::kUp;
  Status cause_ GUARDED_BY(mu_);   // why the link ended
  Status failed_ GUARDED_BY(mu_);  // set in kFailed
  std::vector<Held> held_ GUARDED_BY(mu_);  // waiting for the reconnect
  std::shared_ptr<const v1::ShardMap> map_ GUARDED_BY(mu_);  // the last one installed
  int32_t map_rank_ GUARDED_BY(mu_) = 0;
  std::map<SliceId, std::vector<Retained>> retained_ GUARDED_BY(mu_);  // last two per slice
  std::set<PushId> replayed_ GUARDED_BY(mu_);  // what the last reconnect replayed
  bool closing_ GUARDED_BY(mu_) = false;
  std::thread thread_;  // "trellis-reconn", started at the first loss
};

// A connection over `transport` without recovery (tests and tools).
StatusOr<std::unique_ptr<ServerConnection>> Connect(link::Transport transport,
                                                    const ConnectionOptions& options);

}  // namespace trellis
