// ServerConnection over a link (datapath/link.h): the part of a worker's server connection that
// does not depend on the transport. It numbers requests and routes answers (PendingAnswers),
// lets a pull's payload land straight in the caller's `out` under the operation's data lock,
// and fails what is pending when the link ends. How bytes move is the link's (datapath/connect.h).
#include <grpcpp/grpcpp.h>

#include "common/base/logging.h"
#include "common/base/mutex.h"
#include "common/tls/tls.h"
#include "datapath/connect.h"
#include "trellis/v1/data.grpc.pb.h"
#include "worker-lib/src/pending_answers.h"
#include "worker-lib/src/shard_map_install.h"
#include "worker-lib/src/transport.h"

namespace trellis {
namespace {

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

class LinkConnection final : public ServerConnection, private link::LinkReceiver {
 public:
  // `control`: a channel to the same server for InstallShardMap (the gRPC link's own); nullptr:
  // one is made on first use.
  LinkConnection(const ConnectionOptions& o, std::unique_ptr<link::WorkerLink> l,
                 std::shared_ptr<grpc::Channel> control)
      : options_(o), control_channel_(std::move(control)), link_(std::move(l)) {
    link_->Start(this);
  }

  const std::string& address() const override { return options_.address.service; }

  Status InstallShardMap(const v1::ShardMap& map, int32_t server_rank,
                         int64_t timeout_ms) override {
    if (!control_) {
      if (!control_channel_) {
        grpc::ChannelArguments args;
        auto creds = ChannelCredentials(options_.tls, &args);
        control_channel_ = grpc::CreateCustomChannel(options_.address.service, creds, args);
      }
      control_ = v1::DataService::NewStub(control_channel_);
    }
    return InstallShardMapOnServer(control_.get(), options_, map, server_rank, timeout_ms);
  }

  using ServerConnection::Send;
  void Send(const SliceRequest& r, SliceReply reply, SliceSent sent) override EXCLUDES(mu_) {
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
                SliceSent sent) override EXCLUDES(mu_) {
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
      TLOG_WARN << "server " << options_.address.service << " answered unknown request "
                << h.request_id << ": " << message;
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
    return UnavailableError("data connection to " + options_.address.service +
                            " ended mid-answer: " + st.message());
  }

  const ConnectionOptions options_;
  std::shared_ptr<grpc::Channel> control_channel_;
  std::unique_ptr<v1::DataService::Stub> control_;  // InstallShardMap (FinishDeclarations)

  Mutex mu_;
  PendingAnswers pending_ GUARDED_BY(mu_);
  bool closed_ GUARDED_BY(mu_) = false;  // OnClosed ran
  Status closed_status_ GUARDED_BY(mu_);

  // Last: destroyed first, so its threads have stopped before the state above goes. Destroying
  // the link ends it: OnClosed fails what is pending with CANCELLED.
  std::unique_ptr<link::WorkerLink> link_;
};

}  // namespace

StatusOr<std::unique_ptr<ServerConnection>> Connect(link::Transport transport,
                                                    const ConnectionOptions& o) {
  TRELLIS_ASSIGN_OR_RETURN(link::ConnectedLink l, link::Connect(transport, LinkOptionsOf(o)));
  return std::unique_ptr<ServerConnection>(
      new LinkConnection(o, std::move(l.link), std::move(l.control)));
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

StatusOr<ConnectFn> TransportByName(const std::string& name) {
  TRELLIS_ASSIGN_OR_RETURN(link::Transport transport, link::ParseTransport(name));
  return ConnectFn([transport](const ConnectionOptions& o) { return Connect(transport, o); });
}

}  // namespace trellis
