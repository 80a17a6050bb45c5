// RecoveringConnection: see recovering_connection.h.
#include "worker-lib/src/recovering_connection.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

#include "common/base/logging.h"
#include "common/base/mutex.h"
#include "datapath/address.h"

namespace trellis {
namespace {

using Clock = std::chrono::steady_clock;

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

// A request's "sent" runs at most once over all the connections it travelled on.
struct SentOnce {
  explicit SentOnce(SliceSent f) : fn(std::move(f)) {}
  void Run() {
    if (fn && !ran.exchange(true)) fn();
  }
  SliceSent fn;
  std::atomic<bool> ran{false};
};

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

class RecoveringConnection final : public ServerConnection {
 public:
  RecoveringConnection(const ConnectionOptions& o, RecoveryOptions r,
                       std::unique_ptr<ServerConnection> first)
      : options_(o), recovery_(std::move(r)), inner_(std::move(first)) {}

  ~RecoveringConnection() override {
    std::vector<Held> held;
    std::shared_ptr<ServerConnection> inner;
    std::vector<std::shared_ptr<ServerConnection>> retired;
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
      inner = std::move(inner_);
      retired.swap(retired_);
    }
    const Status st = CancelledError("data connection to " + options_.address.service + " closed");
    for (auto& h : held) h.reply(st, Payload{});
    // Their destructors fail what is pending with CANCELLED, passed through (closing_).
    inner.reset();
    retired.clear();
  }

  const std::string& address() const override { return options_.address.service; }

  Status InstallShardMap(const v1::ShardMap& map, int32_t server_rank,
                         int64_t timeout_ms) override EXCLUDES(mu_) {
    std::shared_ptr<ServerConnection> conn;
    {
      MutexLock lock(&mu_);
      map_ = std::make_shared<const v1::ShardMap>(map);
      map_rank_ = server_rank;
      conn = inner_;
    }
    return conn->InstallShardMap(map, server_rank, timeout_ms);
  }

  using ServerConnection::Send;
  void Send(const SliceRequest& r, SliceReply reply, SliceSent sent) override EXCLUDES(mu_) {
    Retain(r);
    Forward(Held{r, std::move(reply), std::make_shared<SentOnce>(std::move(sent))});
  }

  void SendBulk(const std::vector<SliceRequest>& requests, std::vector<SliceReply> replies,
                SliceSent sent) override EXCLUDES(mu_) {
    auto once = std::make_shared<SentOnce>(std::move(sent));
    std::vector<std::shared_ptr<Held>> held;
    for (size_t i = 0; i < requests.size(); ++i) {
      Retain(requests[i]);
      held.push_back(std::make_shared<Held>(Held{requests[i], std::move(replies[i]), once}));
    }
    std::shared_ptr<ServerConnection> conn;
    uint64_t gen = 0;
    {
      MutexLock lock(&mu_);
      if (state_ != State::kUp) {
        for (auto& h : held) held_.push_back(std::move(*h));
        return;
      }
      conn = inner_;
      gen = generation_;
    }
    std::vector<SliceReply> wrapped;
    for (auto& h : held) wrapped.push_back(WrapReply(h, gen));
    conn->SendBulk(requests, std::move(wrapped), [once] { once->Run(); });
  }

 private:
  enum class State { kUp, kReconnecting, kFailed };
  struct Held {
    SliceRequest request;
    SliceReply reply;
    std::shared_ptr<SentOnce> sent;
  };
  using SliceId = std::pair<uint64_t, uint32_t>;
  using PushId = std::tuple<uint64_t, uint32_t, int64_t>;  // key, slice, step
  struct Retained {
    int64_t step;
    std::shared_ptr<std::vector<uint8_t>> bytes;  // a replay's `encoded` while it is sent
  };

  // Keeps the push as the slice's newest; the oldest of three goes (its buffer is reused).
  void Retain(const SliceRequest& r) EXCLUDES(mu_) {
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

  // Sends on the current connection, or holds while there is none.
  void Forward(Held h) EXCLUDES(mu_) {
    std::shared_ptr<ServerConnection> conn;
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
        conn = inner_;
        gen = generation_;
      }
    }
    if (!failed.ok()) {
      h.reply(failed, Payload{});
      return;
    }
    auto shared = std::make_shared<Held>(std::move(h));
    auto once = shared->sent;
    conn->Send(shared->request, WrapReply(shared, gen), [once] { once->Run(); });
  }

  // A connection's answer: passed on, unless the connection ended (the request is held and
  // the reconnect starts).
  SliceReply WrapReply(std::shared_ptr<Held> h, uint64_t gen) {
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
            resend = true;  // a late answer of a connection already replaced
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

  void StartReconnectLocked(const Status& cause) REQUIRES(mu_) {
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

  // Re-sends a held request on the new connection; a push the replays covered is done.
  void Resume(Held h) EXCLUDES(mu_) {
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

  void ReconnectLoop() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    while (true) {
      while (!closing_ && state_ != State::kReconnecting) cv_.Wait(&mu_);
      if (closing_) return;
      const Status cause = cause_;
      lock.Unlock();
      if (recovery_.reconnects) recovery_.reconnects->Increment();
      std::set<PushId> replayed;
      Status fatal;
      auto conn = Recover(&replayed, &fatal);
      std::vector<Held> held;
      lock.Lock();
      if (closing_) {  // the destructor fails what is held
        lock.Unlock();  // `conn` goes without the lock (its callbacks may take it)
        return;
      }
      if (conn) {
        retired_.push_back(std::move(inner_));
        inner_ = std::move(conn);
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

  // Attempts until one connection took the map and the replays, or the time is up (*fatal
  // then says why; also set at once for an error that retrying cannot mend).
  std::shared_ptr<ServerConnection> Recover(std::set<PushId>* replayed, Status* fatal)
      EXCLUDES(mu_) {
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
      auto conn = Attempt(attempt_end, replayed, &last);
      if (conn) return conn;
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

  std::shared_ptr<ServerConnection> Attempt(Clock::time_point end, std::set<PushId>* replayed,
                                            Status* last) EXCLUDES(mu_) {
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
    auto made = recovery_.connect(o);
    if (!made.ok()) {
      *last = made.status();
      return nullptr;
    }
    std::shared_ptr<ServerConnection> conn = std::move(*made);
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
      Status st = conn->InstallShardMap(*map, rank, left_ms());
      if (!st.ok()) {
        *last = st.Annotate("installing the shard map on " + o.address.service);
        Retire(std::move(conn));
        return nullptr;
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
      conn->Send(q, [latch](const Status& st, const Payload&) { latch->Done(st); });
      ids.insert({slice.first, slice.second, k.step});
    }
    latch->Done(Status::Ok());
    Status st = latch->Wait(end, "replays to " + o.address.service);
    if (st.ok()) {
      auto end_latch = std::make_shared<Latch>(1);
      SliceRequest q;
      q.op = wire::Op::kReplay;
      q.step = static_cast<int64_t>(pushes.size());
      conn->Send(q, [end_latch](const Status& s, const Payload&) { end_latch->Done(s); });
      st = end_latch->Wait(end, "end of replays to " + o.address.service);
    }
    if (!st.ok()) {
      *last = st;
      Retire(std::move(conn));
      return nullptr;
    }
    if (recovery_.replayed) recovery_.replayed->Increment(static_cast<double>(pushes.size()));
    *replayed = std::move(ids);
    return conn;
  }

  // A connection given up on: kept until the destructor (it may still be calling back).
  void Retire(std::shared_ptr<ServerConnection> conn) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    retired_.push_back(std::move(conn));
  }

  const ConnectionOptions options_;
  const RecoveryOptions recovery_;

  Mutex mu_;
  CondVar cv_;  // the reconnect thread: work, or closing
  std::shared_ptr<ServerConnection> inner_ GUARDED_BY(mu_);
  // Connections replaced or given up on; destroyed last, never from one of their own callbacks.
  std::vector<std::shared_ptr<ServerConnection>> retired_ GUARDED_BY(mu_);
  uint64_t generation_ GUARDED_BY(mu_) = 0;  // bumped per new connection
  State state_ GUARDED_BY(mu_) = State::kUp;
  Status cause_ GUARDED_BY(mu_);   // why the connection ended
  Status failed_ GUARDED_BY(mu_);  // set in kFailed
  std::vector<Held> held_ GUARDED_BY(mu_);  // waiting for the reconnect
  std::shared_ptr<const v1::ShardMap> map_ GUARDED_BY(mu_);  // the last one installed
  int32_t map_rank_ GUARDED_BY(mu_) = 0;
  std::map<SliceId, std::vector<Retained>> retained_ GUARDED_BY(mu_);  // last two per slice
  std::set<PushId> replayed_ GUARDED_BY(mu_);  // what the last reconnect replayed
  bool closing_ GUARDED_BY(mu_) = false;
  std::thread thread_;                  // "trellis-reconn", started at the first loss
};

}  // namespace

std::unique_ptr<ServerConnection> MakeRecoveringConnection(const ConnectionOptions& options,
                                                           RecoveryOptions recovery,
                                                           std::unique_ptr<ServerConnection> first) {
  return std::make_unique<RecoveringConnection>(options, std::move(recovery), std::move(first));
}

}  // namespace trellis
