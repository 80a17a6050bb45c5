// The requests a server connection sent and the server has not answered yet, by request id:
// the bookkeeping of one link of the worker's connection (server_connection.cc; the links,
// datapath/tcp/ and datapath/grpc/, only move bytes). It numbers requests, remembers where
// each answer's payload goes, routes an answer to its request, fails a bulk's entries when the
// server refuses the bulk as a whole, and hands everything over when the connection breaks.
//
// Not thread-safe: the owning connection guards it with its own lock.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "worker-lib/src/transport.h"

namespace trellis {

class PendingAnswers {
 public:
  struct Entry {
    SliceReply reply;
    // Where the answer's payload may be read in place (SliceRequest::out and its lock).
    float* out = nullptr;
    uint64_t out_bytes = 0;
    std::shared_mutex* out_mu = nullptr;
    const std::atomic<bool>* out_closed = nullptr;
    uint64_t bulk_id = 0;  // the bulk it travelled in, or 0
  };

  // Numbers one request and keeps its reply; returns its id (never 0: 0 names the stream).
  uint64_t Add(const SliceRequest& request, SliceReply reply);

  // Numbers a bulk frame and its entries: the bulk gets the returned id, entry i the id
  // `*first_entry_id + i`. An error answer to the bulk's id fails every entry still pending;
  // once one entry is answered the server took the bulk and no such error can follow.
  // REQUIRES: requests.size() == replies.size() >= 1.
  uint64_t AddBulk(const std::vector<SliceRequest>& requests, std::vector<SliceReply> replies,
                   uint64_t* first_entry_id);

  // What an answer to `request_id` with status `code` (0: OK) resolves.
  struct Routed {
    bool found = false;  // a request (`entry`) or a refused bulk (`refused`) had this id
    Entry entry;         // the answered request (reply empty when the answer was for a bulk)
    std::vector<Entry> refused;  // a bulk's entries, refused with the bulk's error
  };
  Routed Take(uint64_t request_id, int32_t code);

  // Every pending request, for failing them all (the connection broke or closed); the table is
  // empty afterwards and numbering goes on.
  std::vector<Entry> TakeAll();

  size_t size() const { return pending_.size(); }

 private:
  static Entry EntryOf(const SliceRequest& request, SliceReply reply);

  std::unordered_map<uint64_t, Entry> pending_;
  // bulk id -> (first entry id, entries), until one entry is answered or the bulk is refused.
  std::unordered_map<uint64_t, std::pair<uint64_t, size_t>> bulks_;
  uint64_t next_id_ = 1;
};

}  // namespace trellis
