// See pending_answers.h.
#include "worker-lib/src/pending_answers.h"

namespace trellis {

PendingAnswers::Entry PendingAnswers::EntryOf(const SliceRequest& r, SliceReply reply) {
  return Entry{std::move(reply), r.out, static_cast<uint64_t>(r.out_elements) * sizeof(float),
               r.out_mu, r.out_closed, 0};
}

uint64_t PendingAnswers::Add(const SliceRequest& request, SliceReply reply) {
  const uint64_t id = next_id_++;
  pending_.emplace(id, EntryOf(request, std::move(reply)));
  return id;
}

uint64_t PendingAnswers::AddBulk(const std::vector<SliceRequest>& requests,
                                 std::vector<SliceReply> replies, uint64_t* first_entry_id) {
  const uint64_t bulk_id = next_id_++;
  *first_entry_id = next_id_;
  for (size_t i = 0; i < requests.size(); ++i) {
    Entry e = EntryOf(requests[i], std::move(replies[i]));
    e.bulk_id = bulk_id;
    pending_.emplace(next_id_++, std::move(e));
  }
  bulks_.emplace(bulk_id, std::make_pair(*first_entry_id, requests.size()));
  return bulk_id;
}

PendingAnswers::Routed PendingAnswers::Take(uint64_t request_id, int32_t code) {
  Routed routed;
  if (auto b = bulks_.find(request_id); b != bulks_.end()) {
    if (code != 0) {
      const auto [first, count] = b->second;
      for (uint64_t id = first; id < first + count; ++id) {
        if (auto e = pending_.find(id); e != pending_.end()) {
          routed.refused.push_back(std::move(e->second));
          pending_.erase(e);
        }
      }
      routed.found = true;
    }
    bulks_.erase(b);
  }
  if (auto it = pending_.find(request_id); it != pending_.end()) {
    routed.entry = std::move(it->second);
    pending_.erase(it);
    routed.found = true;
    // An entry was answered: the server took its bulk, no error for it can follow.
    if (routed.entry.bulk_id != 0) bulks_.erase(routed.entry.bulk_id);
  }
  return routed;
}

std::vector<PendingAnswers::Entry> PendingAnswers::TakeAll() {
  std::vector<Entry> all;
  all.reserve(pending_.size());
  for (auto& [id, e] : pending_) all.push_back(std::move(e));
  pending_.clear();
  bulks_.clear();
  return all;
}

}  // namespace trellis
