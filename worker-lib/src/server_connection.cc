// ServerConnection: see server_connection.h. A LinkSession is one link and the requests sent on
// it; the connection swaps sessions on a reconnect, and a session's callbacks (a late OnClosed
// after a mid-answer error, a dropped reconnect candidate) only ever touch its own table.
#include "worker-lib/src/server_connection.h"

#include <grpcpp/grpcpp.h>
#include <pthread.h>

#include <algorithm>
#include <cstring>

#include "common/base/logging.h"
#include "common/tls/tls.h"
#include "datapath/address.h"
#include "trellis/v1/data.grpc.pb.h"
#include "worker-lib/src/pending_answers.h"
#include "worker-lib/src/shard_map_install.h"

namespace trellis {
namespace {

using Clock = std::chrono::steady_clock;

// Holds the operation's data lock (shared) while bytes land in `out`; refuses once the
// operation completed.
class OutGuard final : public link::WriteGuard {
 public:
  OutGuard(std::shared_mutex* mu, const std::atomic<bool>* closed) : mu_(mu), closed_(closed) {}
  bool Begin() override {
    if (mu_ == nullptr) return true;
    mu_->lock_shared();
    if (closed_ != nullptr && closed_->load()) {
      mu_->unlock_shared();
      return false;
    }
    return true;
  }
  void End() override {
    if (mu_ != nullptr) mu_->unlock_shared();
  }

 private:
  std::shared_mutex* const mu_;
  const std::atomic<bool>* const closed_;
};

link::LinkOptions LinkOptionsOf(const ConnectionOptions& o) {
  return {.address = o.address,
          .use_local_socket = o.use_local_socket,
          .token = o.token,
          .worker_rank = o.worker_rank,
          .max_answer_payload = static_cast<uint64_t>(wire::MaxMessageBytes(o.slice_bytes)),
          .timeout_ms = o.timeout_ms,
          .tls = o.tls};
}

// InstallShardMap and HandOver over a channel to the link's server: the gRPC link's own, or one
// made on first use. Called by one thread at a time (the worker's declaration rounds, the
// reconnect, a server resize at a step boundary).
struct ControlCalls {
  ControlCalls(const ConnectionOptions& o, std::shared_ptr<grpc::Channel> c)
      : options(o), channel(std::move(c)) {}
  Status Install(const v1::ShardMap& map, int32_t server_rank, int64_t timeout_ms) {
    return InstallShardMapOnServer(Stub(), options, map, server_rank, timeout_ms);
  }
  StatusOr<std::string> HandOver(const std::string& frame, int64_t timeout_ms) {
    return HandOverOnServer(Stub(), options, frame, timeout_ms);
  }
  v1::DataService::Stub* Stub() {
    if (!stub) {
      if (!channel) {
        grpc::ChannelArguments args;
        auto creds = ChannelCredentials(options.tls, &args);
        // A handout answers up to a slice and its state block, as a pull does.
        args.SetMaxReceiveMessageSize(static_cast<int>(wire::MaxMessageBytes(options.slice_bytes)));
        channel = grpc::CreateCustomChannel(options.address.service, creds, args);
      }
      stub = v1::DataService::NewStub(channel);
    }
    return stub.get();
  }
  const ConnectionOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::DataService::Stub> stub;
};

bool IsPush(wire::Op op) {
  return op == wire::Op::kPush || op == wire::Op::kPushPull || wire::IsTwoBit(op);
}

// The push request as it went out (header + payload), replayed as the payload of a kReplay.
// Written into `reuse` when it is the right size (a retained buffer nobody else holds: no fresh
// multi-MiB allocation and page faults per push), else into a new buffer.
std::shared_ptr<std::vector<uint8_t>> RetainedBytes(const SliceRequest& r,
                                                    std::shared_ptr<std::vector<uint8_t>> reuse) {
  wire::RequestHeader h = HeaderOf(r);
  h.op = wire::IsTwoBit(r.op) ? wire::Op::kPushTwoBit : wire::Op::kPush;
  const size_t bytes = wire::kRequestHeaderBytes + h.payload_bytes;
  auto out = reuse && reuse.use_count() == 1 && reuse->size() == bytes
                 ? std::move(reuse)
                 : std::make_shared<std::vector<uint8_t>>(bytes);
  wire::EncodeRequestHeader(h, out->data());
  if (h.payload_bytes > 0) {
    std::memcpy(out->data() + wire::kRequestHeaderBytes, PayloadData(r), h.payload_bytes);
  }
  return out;
}

// Counts down the answers to a batch of requests (the replays); outlives a wait that gave up.
struct Latch {
  explicit Latch(int64_t n) : left(n) {}
  Mutex mu;
  CondVar cv;
  int64_t left GUARDED_BY(mu);
  Status first_error GUARDED_BY(mu);
  void Done(const Status& st) EXCLUDES(mu) {
    MutexLock lock(&mu);
    if (!st.ok() && first_error.ok()) first_error = st;
    if (--left == 0) cv.SignalAll();
  }
  Status Wait(Clock::time_point deadline, const std::string& what) EXCLUDES(mu) {
    MutexLock lock(&mu);
    while (left != 0 && cv.WaitUntil(&mu, deadline)) {
    }
    if (left != 0) {
      return DeadlineExceededError(what + ": " + std::to_string(left) + " not answered in time");
    }
    return first_error;
  }
};

}  // namespace

struct ServerConnection::SentOnce {
  explicit SentOnce(SliceSent f) : fn(std::move(f)) {}
  void Run() {
    if (fn && !ran.exchange(true)) fn();
  }
  SliceSent fn;
  std::atomic<bool> ran{false};
};

// One link and the requests sent on it, by request id.
class ServerConnection::LinkSession final : private link::LinkReceiver {
 public:
  LinkSession(const ConnectionOptions& o, ServerLink l)
      : service_(o.address.service),
        install_map_(std::move(l.install_map)),
        hand_over_(std::move(l.hand_over)),
        link_(std::move(l.link)) {
    link_->Start(this);
  }

  Status InstallShardMap(const v1::ShardMap& map, int32_t server_rank, int64_t timeout_ms) {
    return install_map_(map, server_rank, timeout_ms);
  }
  StatusOr<std::string> HandOver(const std::string& frame, int64_t timeout_ms) {
    if (!hand_over_) return UnimplementedError("this link has no handover call");
    return hand_over_(frame, timeout_ms);
  }

  void Send(const SliceRequest& r, SliceReply reply, SliceSent sent) EXCLUDES(mu_) {
    link::OutFrame f;
    wire::RequestHeader h = HeaderOf(r);
    f.first.payload = PayloadData(r);
    f.first.payload_bytes = h.payload_bytes;
    f.first.encoded = r.encoded;
    f.sent = std::move(sent);
    Status dead;
    {
      MutexLock lock(&mu_);
      if (closed_) {
        dead = closed_status_;
      } else {
        h.request_id = pending_.Add(r, std::move(reply));
      }
    }
    if (!dead.ok()) {
      reply(dead, Payload{});
      return;
    }
    wire::EncodeRequestHeader(h, f.first.head);
    link_->Write(std::move(f));
  }

  void SendBulk(const std::vector<SliceRequest>& requests, std::vector<SliceReply> replies,
                SliceSent sent) EXCLUDES(mu_) {
    link::OutFrame f;
    f.sent = std::move(sent);
    f.entries.resize(requests.size());
    wire::RequestHeader bulk;
    bulk.op = wire::Op::kBulk;
    bulk.priority = requests.front().priority;
    for (size_t i = 0; i < requests.size(); ++i) {
      f.entries[i].payload = PayloadData(requests[i]);
      f.entries[i].payload_bytes = PayloadBytes(requests[i]);
      f.entries[i].encoded = requests[i].encoded;
      bulk.payload_bytes += wire::kRequestHeaderBytes + f.entries[i].payload_bytes;
    }
    Status dead;
    uint64_t first_entry = 0;
    {
      MutexLock lock(&mu_);
      if (closed_) {
        dead = closed_status_;
      } else {
        bulk.request_id = pending_.AddBulk(requests, std::move(replies), &first_entry);
      }
    }
    if (!dead.ok()) {
      for (auto& reply : replies) reply(dead, Payload{});
      return;
    }
    wire::EncodeRequestHeader(bulk, f.first.head);
    for (size_t i = 0; i < requests.size(); ++i) {
      wire::RequestHeader h = HeaderOf(requests[i]);
      h.request_id = first_entry + i;
      wire::EncodeRequestHeader(h, f.entries[i].head);
    }
    link_->Write(std::move(f));
  }

 private:
  void OnAnswer(const wire::ResponseHeader& h, std::string_view message,
                link::AnswerPayload& payload) override EXCLUDES(mu_) {
    PendingAnswers::Routed routed;
    {
      MutexLock lock(&mu_);
      routed = pending_.Take(h.request_id, h.code);
    }
    const Status answered(static_cast<StatusCode>(h.code), std::string(message));
    // The entries of a bulk the server refused as a whole.
    for (auto& e : routed.refused) e.reply(answered, Payload{});
    if (!routed.found) {
      TLOG_WARN << "server " << service_ << " answered unknown request " << h.request_id << ": "
                << message;
      return;
    }
    PendingAnswers::Entry& p = routed.entry;
    if (!p.reply) return;  // the answer was for a refused bulk
    if (h.code != 0) {
      p.reply(answered, Payload{});
    } else if (h.payload_bytes == 0) {
      p.reply(Status::Ok(), Payload{});
    } else if (p.out != nullptr && h.payload_bytes == p.out_bytes && !h.packed) {
      OutGuard guard(p.out_mu, p.out_closed);
      if (Status st = payload.ReadInto(p.out, &guard); !st.ok()) {
        p.reply(MidAnswer(st), Payload{});
        return;
      }
      p.reply(Status::Ok(), Payload{nullptr, 0, h.payload_bytes, /*in_place=*/true});
    } else {
      // A packed answer, or an unexpected length (bounded by the link's limit): hand the bytes
      // over; the worker decodes the one and reports the other.
      auto chunks = payload.View();
      if (!chunks.ok()) {
        p.reply(MidAnswer(chunks.status()), Payload{});
        return;
      }
      p.reply(Status::Ok(), Payload{&*chunks, 0, h.payload_bytes, false, h.packed});
    }
  }

  void OnClosed(const Status& status) override EXCLUDES(mu_) {
    std::vector<PendingAnswers::Entry> pending;
    {
      MutexLock lock(&mu_);
      closed_ = true;
      closed_status_ = status;
      pending = pending_.TakeAll();
    }
    for (auto& p : pending) p.reply(status, Payload{});
  }

  Status MidAnswer(const Status& st) const {
    return UnavailableError("data connection to " + service_ + " ended mid-answer: " +
                            st.message());
  }

  const std::string service_;  // the server's, in messages
  const std::function<Status(const v1::ShardMap&, int32_t, int64_t)> install_map_;
  const std::function<StatusOr<std::string>(const std::string&, int64_t)> hand_over_;

  Mutex mu_;
  PendingAnswers pending_ GUARDED_BY(mu_);
  bool closed_ GUARDED_BY(mu_) = false;  // OnClosed ran
  Status closed_status_ GUARDED_BY(mu_);

  // Last: destroyed first, so its threads have stopped before the state above goes. Destroying
  // the link ends it: OnClosed fails what is pending with CANCELLED.
  std::unique_ptr<link::WorkerLink> link_;
};

StatusOr<std::unique_ptr<ServerConnection>> ServerConnection::Open(
    const ConnectionOptions& options, LinkOpener open, std::optional<RecoveryOptions> recovery) {
  TRELLIS_ASSIGN_OR_RETURN(ServerLink first, open(options));
  auto session = std::make_shared<LinkSession>(options, std::move(first));
  return std::unique_ptr<ServerConnection>(
      new ServerConnection(options, std::move(open), std::move(recovery), std::move(session)));
}

ServerConnection::ServerConnection(const ConnectionOptions& o, LinkOpener open,
                                   std::optional<RecoveryOptions> recovery,
                                   std::shared_ptr<LinkSession> first)
    : options_(o),
      open_(std::move(open)),
      recovering_(recovery.has_value()),
      recovery_(recovery ? std::move(*recovery) : RecoveryOptions{}),
      session_(std::move(first)) {}

ServerConnection::~ServerConnection() {
  std::vector<Held> held;
  std::shared_ptr<LinkSession> session;
  std::vector<std::shared_ptr<LinkSession>> retired;
  {
    MutexLock lock(&mu_);
    closing_ = true;
    held.swap(held_);
    cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
  {
    MutexLock lock(&mu_);
    held.insert(held.end(), std::make_move_iterator(held_.begin()),
                std::make_move_iterator(held_.end()));
    held_.clear();
    session = std::move(session_);
    retired.swap(retired_);
  }
  const Status st = CancelledError("data connection to " + options_.address.service + " closed");
  for (auto& h : held) h.reply(st, Payload{});
  // Their destructors fail what is pending with CANCELLED, passed through (closing_).
  session.reset();
  retired.clear();
}

Status ServerConnection::InstallShardMap(const v1::ShardMap& map, int32_t server_rank,
                                         int64_t timeout_ms) {
  std::shared_ptr<LinkSession> session;
  {
    MutexLock lock(&mu_);
    if (recovering_) {
      map_ = std::make_shared<const v1::ShardMap>(map);
      map_rank_ = server_rank;
    }
    session = session_;
  }
  return session->InstallShardMap(map, server_rank, timeout_ms);
}

StatusOr<std::string> ServerConnection::HandOver(const std::string& frame, int64_t timeout_ms) {
  std::shared_ptr<LinkSession> session;
  {
    MutexLock lock(&mu_);
    session = session_;
  }
  return session->HandOver(frame, timeout_ms);
}

void ServerConnection::Send(const SliceRequest& r, SliceReply reply, SliceSent sent) {
  if (!recovering_) {
    std::shared_ptr<LinkSession> session;
    {
      MutexLock lock(&mu_);
      session = session_;
    }
    session->Send(r, std::move(reply), std::move(sent));
    return;
  }
  Retain(r);
  Forward(Held{r, std::move(reply), std::make_shared<SentOnce>(std::move(sent))});
}

void ServerConnection::SendBulk(const std::vector<SliceRequest>& requests,
                                std::vector<SliceReply> replies, SliceSent sent) {
  if (!recovering_) {
    std::shared_ptr<LinkSession> session;
    {
      MutexLock lock(&mu_);
      session = session_;
    }
    session->SendBulk(requests, std::move(replies), std::move(sent));
    return;
  }
  auto once = std::make_shared<SentOnce>(std::move(sent));
  std::vector<std::shared_ptr<Held>> held;
  for (size_t i = 0; i < requests.size(); ++i) {
    Retain(requests[i]);
    held.push_back(std::make_shared<Held>(Held{requests[i], std::move(replies[i]), once}));
  }
  std::shared_ptr<LinkSession> session;
  uint64_t gen = 0;
  {
    MutexLock lock(&mu_);
    if (state_ != State::kUp) {
      for (auto& h : held) held_.push_back(std::move(*h));
      return;
    }
    session = session_;
    gen = generation_;
  }
  std::vector<SliceReply> wrapped;
  for (auto& h : held) wrapped.push_back(WrapReply(h, gen));
  session->SendBulk(requests, std::move(wrapped), [once] { once->Run(); });
}

// Keeps the push as the slice's newest; the oldest of three goes (its buffer is reused).
void ServerConnection::Retain(const SliceRequest& r) {
  if (!IsPush(r.op)) return;
  std::shared_ptr<std::vector<uint8_t>> reuse;
  {
    MutexLock lock(&mu_);
    auto& kept = retained_[{r.key, r.slice}];
    std::erase_if(kept, [&](const Retained& k) { return k.step == r.step; });
    if (kept.size() >= 2) {
      reuse = std::move(kept.front().bytes);
      kept.erase(kept.begin());
    }
  }
  auto bytes = RetainedBytes(r, std::move(reuse));  // the copy, outside the lock
  MutexLock lock(&mu_);
  auto& kept = retained_[{r.key, r.slice}];
  kept.push_back({r.step, std::move(bytes)});
  std::sort(kept.begin(), kept.end(),
            [](const Retained& a, const Retained& b) { return a.step < b.step; });
  if (kept.size() > 2) kept.erase(kept.begin());
}

// Sends on the current link, or holds while there is none.
void ServerConnection::Forward(Held h) {
  std::shared_ptr<LinkSession> session;
  uint64_t gen = 0;
  Status failed;
  {
    MutexLock lock(&mu_);
    if (state_ == State::kFailed) {
      failed = failed_;
    } else if (state_ == State::kReconnecting) {
      held_.push_back(std::move(h));
      return;
    } else {
      session = session_;
      gen = generation_;
    }
  }
  if (!failed.ok()) {
    h.reply(failed, Payload{});
    return;
  }
  auto shared = std::make_shared<Held>(std::move(h));
  auto once = shared->sent;
  session->Send(shared->request, WrapReply(shared, gen), [once] { once->Run(); });
}

// A link's answer: passed on, unless the link ended (the request is held and the reconnect
// starts).
SliceReply ServerConnection::WrapReply(std::shared_ptr<Held> h, uint64_t gen) {
  return [this, h = std::move(h), gen](const Status& st, const Payload& p) {
    if (st.code() == StatusCode::kUnavailable) {
      bool resend = false;
      {
        MutexLock lock(&mu_);
        if (!closing_ && state_ != State::kFailed) {
          if (gen == generation_ || state_ == State::kReconnecting) {
            held_.push_back(std::move(*h));
            if (state_ == State::kUp) StartReconnectLocked(st);
            return;
          }
          resend = true;  // a late answer of a link already replaced
        }
      }
      if (resend) {
        Resume(std::move(*h));
        return;
      }
    }
    h->reply(st, p);
  };
}

void ServerConnection::StartReconnectLocked(const Status& cause) {
  state_ = State::kReconnecting;
  cause_ = cause;
  TLOG_WARN << "server " << recovery_.server_rank << " (" << options_.address.service
            << "): " << cause.ToString() << "; reconnecting and replaying";
  if (!thread_.joinable()) {
    thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "trellis-reconn");
      ReconnectLoop();
    });
  }
  cv_.SignalAll();
}

// Re-sends a held request on the new link; a push the replays covered is done.
void ServerConnection::Resume(Held h) {
  const PushId id{h.request.key, h.request.slice, h.request.step};
  bool covered = false;
  {
    MutexLock lock(&mu_);
    covered = IsPush(h.request.op) && replayed_.count(id) != 0;
  }
  if (!covered) {
    Forward(std::move(h));
    return;
  }
  h.sent->Run();
  if (!wire::AnswersWithValues(h.request.op)) {
    h.reply(Status::Ok(), Payload{});
    return;
  }
  // The push arrived as a replay: only its answer is missing, in the form the op accepts.
  h.request.op = wire::AcceptsPacked(h.request.op) ? wire::Op::kPullPacked : wire::Op::kPull;
  h.request.payload = nullptr;
  h.request.payload_elements = 0;
  h.request.encoded = nullptr;
  Forward(std::move(h));
}

void ServerConnection::ReconnectLoop() {
  MutexLock lock(&mu_);
  while (true) {
    while (!closing_ && state_ != State::kReconnecting) cv_.Wait(&mu_);
    if (closing_) return;
    const Status cause = cause_;
    lock.Unlock();
    if (recovery_.reconnects) recovery_.reconnects->Increment();
    std::set<PushId> replayed;
    Status fatal;
    auto session = Recover(&replayed, &fatal);
    std::vector<Held> held;
    lock.Lock();
    if (closing_) {  // the destructor fails what is held
      lock.Unlock();  // `session` goes without the lock (its callbacks may take it)
      return;
    }
    if (session) {
      retired_.push_back(std::move(session_));
      session_ = std::move(session);
      ++generation_;
      replayed_ = std::move(replayed);
      state_ = State::kUp;
      TLOG_INFO << "server " << recovery_.server_rank << ": reconnected, replayed "
                << replayed_.size() << " pushes";
    } else {
      state_ = State::kFailed;
      failed_ = Status(fatal.code() == StatusCode::kUnavailable ? StatusCode::kUnavailable
                                                               : fatal.code(),
                       "server " + std::to_string(recovery_.server_rank) + " (" +
                           options_.address.service + ") lost (" + cause.message() +
                           ") and not recovered: " + fatal.message());
      TLOG_ERROR << failed_.ToString();
    }
    held.swap(held_);
    const Status failed = failed_;
    const bool up = state_ == State::kUp;
    lock.Unlock();
    for (auto& h : held) {
      if (up) {
        Resume(std::move(h));
      } else {
        h.reply(failed, Payload{});
      }
    }
    lock.Lock();
  }
}

// Attempts until one link took the map and the replays, or the time is up (*fatal then says
// why; also set at once for an error that retrying cannot mend).
std::shared_ptr<ServerConnection::LinkSession> ServerConnection::Recover(
    std::set<PushId>* replayed, Status* fatal) {
  const auto timeout = std::chrono::milliseconds(options_.timeout_ms);
  auto deadline = Clock::now() + timeout;
  auto backoff = std::chrono::milliseconds(50);
  Status last = UnavailableError("no attempt made");
  int attempts = 0;
  while (true) {
    if (Clock::now() >= deadline && recovery_.restarting_seen_at) {
      deadline = std::max(deadline, recovery_.restarting_seen_at() + timeout);
    }
    if (Clock::now() >= deadline) break;
    {
      MutexLock lock(&mu_);
      if (closing_) break;
    }
    ++attempts;
    const auto attempt_end =
        std::min(deadline, Clock::now() + std::chrono::milliseconds(recovery_.attempt_timeout_ms));
    auto session = Attempt(attempt_end, replayed, &last);
    if (session) return session;
    if (attempts == 1 || attempts % 10 == 0) {
      TLOG_INFO << "server " << recovery_.server_rank << ": reconnect attempt " << attempts
                << ": " << last.ToString();
    }
    const StatusCode c = last.code();
    if (c != StatusCode::kUnavailable && c != StatusCode::kDeadlineExceeded &&
        c != StatusCode::kCancelled) {
      *fatal = last;  // the server answered and refused (e.g. update mode without checkpoints)
      return nullptr;
    }
    MutexLock lock(&mu_);
    const auto until = std::min(deadline, Clock::now() + backoff);
    while (!closing_ && cv_.WaitUntil(&mu_, until)) {
    }
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  *fatal = UnavailableError(std::to_string(attempts) + " attempts in " +
                            std::to_string(options_.timeout_ms) + " ms; last: " + last.ToString());
  return nullptr;
}

std::shared_ptr<ServerConnection::LinkSession> ServerConnection::Attempt(
    Clock::time_point end, std::set<PushId>* replayed, Status* last) {
  auto left_ms = [&] {
    return std::max<int64_t>(
        1, std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count());
  };
  ConnectionOptions o = options_;
  o.timeout_ms = left_ms();
  if (recovery_.resolve) {
    auto address = recovery_.resolve(recovery_.server_rank, left_ms());
    if (!address.ok()) {
      *last = address.status().Annotate("resolving the server's address");
      return nullptr;
    }
    auto parsed = DataAddress::Parse(*address);
    if (!parsed.ok()) {
      *last = parsed.status();
      return nullptr;
    }
    o.address = std::move(*parsed);
  }
  auto made = open_(o);
  if (!made.ok()) {
    *last = made.status();
    return nullptr;
  }
  auto session = std::make_shared<LinkSession>(o, std::move(*made));
  std::shared_ptr<const v1::ShardMap> map;
  int32_t rank = 0;
  std::vector<std::pair<SliceId, Retained>> pushes;
  {
    MutexLock lock(&mu_);
    map = map_;
    rank = map_rank_;
    for (const auto& [id, kept] : retained_) {
      for (const auto& k : kept) pushes.push_back({id, k});
    }
  }
  if (map) {
    Status st = session->InstallShardMap(*map, rank, left_ms());
    if (!st.ok()) {
      *last = st.Annotate("installing the shard map on " + o.address.service);
      Retire(std::move(session));
      return nullptr;
    }
  }
  if (recovery_.world) {
    // After a resize the server must count in the workers' world before it rebuilds: a
    // restarted one starts from the job's first (docs/elastic.md#what-survives-what).
    auto [epoch, members] = recovery_.world();
    if (epoch > 0) {
      auto world_latch = std::make_shared<Latch>(1);
      SliceRequest q;
      q.op = wire::Op::kWorld;
      q.step = epoch;
      q.priority = INT32_MAX;
      q.encoded = std::make_shared<const std::vector<uint8_t>>(wire::EncodeWorldMembers(members));
      session->Send(q, [world_latch](const Status& s, const Payload&) { world_latch->Done(s); },
                    nullptr);
      Status st = world_latch->Wait(end, "world " + std::to_string(epoch) + " to " +
                                             o.address.service);
      // A newer world there (announced by another worker meanwhile) is not this link's concern.
      if (!st.ok() && st.code() != StatusCode::kFailedPrecondition) {
        *last = st;
        Retire(std::move(session));
        return nullptr;
      }
    }
  }
  // The replays, all answered before the end is sent (the server may serve them in any order).
  auto latch = std::make_shared<Latch>(static_cast<int64_t>(pushes.size()) + 1);
  std::set<PushId> ids;
  for (const auto& [slice, k] : pushes) {
    SliceRequest q;
    q.op = wire::Op::kReplay;
    q.key = slice.first;
    q.slice = slice.second;
    q.step = k.step;
    q.priority = INT32_MAX;
    q.encoded = k.bytes;
    session->Send(q, [latch](const Status& st, const Payload&) { latch->Done(st); }, nullptr);
    ids.insert({slice.first, slice.second, k.step});
  }
  latch->Done(Status::Ok());
  Status st = latch->Wait(end, "replays to " + o.address.service);
  if (st.ok()) {
    auto end_latch = std::make_shared<Latch>(1);
    SliceRequest q;
    q.op = wire::Op::kReplay;
    q.step = static_cast<int64_t>(pushes.size());
    session->Send(q, [end_latch](const Status& s, const Payload&) { end_latch->Done(s); },
                  nullptr);
    st = end_latch->Wait(end, "end of replays to " + o.address.service);
  }
  if (!st.ok()) {
    *last = st;
    Retire(std::move(session));
    return nullptr;
  }
  if (recovery_.replayed) recovery_.replayed->Increment(static_cast<double>(pushes.size()));
  *replayed = std::move(ids);
  return session;
}

// A link given up on: kept until the destructor (it may still be calling back).
void ServerConnection::Retire(std::shared_ptr<LinkSession> session) {
  MutexLock lock(&mu_);
  retired_.push_back(std::move(session));
}

wire::RequestHeader HeaderOf(const SliceRequest& r) {
  wire::RequestHeader h;
  h.op = r.op;
  h.key = r.key;
  h.slice = r.slice;
  h.step = r.step;
  h.priority = r.priority;
  h.payload_bytes = PayloadBytes(r);
  return h;
}

StatusOr<ServerLink> OpenLink(link::Transport transport, const ConnectionOptions& o) {
  TRELLIS_ASSIGN_OR_RETURN(link::ConnectedLink l, link::Connect(transport, LinkOptionsOf(o)));
  auto control = std::make_shared<ControlCalls>(o, std::move(l.control));
  return ServerLink{std::move(l.link),
                    [control](const v1::ShardMap& map, int32_t rank, int64_t timeout_ms) {
                      return control->Install(map, rank, timeout_ms);
                    },
                    [control](const std::string& frame, int64_t timeout_ms) {
                      return control->HandOver(frame, timeout_ms);
                    }};
}

StatusOr<LinkOpener> TransportByName(const std::string& name) {
  TRELLIS_ASSIGN_OR_RETURN(link::Transport transport, link::ParseTransport(name));
  return LinkOpener([transport](const ConnectionOptions& o) { return OpenLink(transport, o); });
}

StatusOr<std::unique_ptr<ServerConnection>> Connect(link::Transport transport,
                                                    const ConnectionOptions& options) {
  return ServerConnection::Open(
      options, [transport](const ConnectionOptions& o) { return OpenLink(transport, o); },
      std::nullopt);
}

}  // namespace trellis
