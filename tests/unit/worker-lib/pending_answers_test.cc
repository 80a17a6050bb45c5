// PendingAnswers: the answer routing both worker transports share. A worker relies on every
// request being answered exactly once, by its own answer or by the error that ended it.
#include "worker-lib/src/pending_answers.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace trellis {
namespace {

// Records which requests' replies ran, and with what.
struct Replies {
  std::vector<std::string> ran;  // "<name>:<code>"
  SliceReply For(const std::string& name) {
    return [this, name](const Status& st, const Payload&) {
      ran.push_back(name + ":" + std::to_string(static_cast<int>(st.code())));
    };
  }
};

// A bulk of two entries, "e0" and "e1".
uint64_t AddPairBulk(PendingAnswers& table, Replies& replies, uint64_t* first) {
  return table.AddBulk(std::vector<SliceRequest>(2), {replies.For("e0"), replies.For("e1")}, first);
}

void Answer(PendingAnswers::Entry& e, const Status& st) { e.reply(st, Payload{}); }

TEST(PendingAnswers, EachAnswerReachesItsOwnRequestWithItsOutput) {
  PendingAnswers table;
  Replies replies;
  float out_a[4], out_b[8];
  SliceRequest a, b;
  a.out = out_a;
  a.out_elements = 4;
  b.out = out_b;
  b.out_elements = 8;
  const uint64_t ida = table.Add(a, replies.For("a"));
  const uint64_t idb = table.Add(b, replies.For("b"));
  EXPECT_NE(ida, 0u);  // 0 names the stream itself
  EXPECT_NE(idb, 0u);
  EXPECT_NE(ida, idb);

  auto rb = table.Take(idb, 0);
  ASSERT_TRUE(rb.found);
  EXPECT_TRUE(rb.refused.empty());
  EXPECT_EQ(rb.entry.out, out_b);
  EXPECT_EQ(rb.entry.out_bytes, 8 * sizeof(float));
  Answer(rb.entry, Status::Ok());
  // Answered once: a second answer with the same id finds nothing.
  EXPECT_FALSE(table.Take(idb, 0).found);
  auto ra = table.Take(ida, 0);
  ASSERT_TRUE(ra.found);
  EXPECT_EQ(ra.entry.out, out_a);
  Answer(ra.entry, Status::Ok());
  EXPECT_EQ(replies.ran, (std::vector<std::string>{"b:0", "a:0"}));
  EXPECT_EQ(table.size(), 0u);
}

TEST(PendingAnswers, AnUnknownIdFindsNothing) {
  PendingAnswers table;
  Replies replies;
  table.Add(SliceRequest{}, replies.For("a"));
  EXPECT_FALSE(table.Take(12345, 0).found);
  EXPECT_FALSE(table.Take(0, 13).found);  // an error about the stream is the transport's to handle
  EXPECT_EQ(table.size(), 1u);
}

TEST(PendingAnswers, ABulkRefusedAsAWholeFailsEveryEntryStillPending) {
  PendingAnswers table;
  Replies replies;
  std::vector<SliceRequest> requests(3);
  uint64_t first = 0;
  const uint64_t bulk =
      table.AddBulk(requests, {replies.For("e0"), replies.For("e1"), replies.For("e2")}, &first);
  EXPECT_EQ(table.size(), 3u);
  std::set<uint64_t> ids = {bulk, first, first + 1, first + 2};
  EXPECT_EQ(ids.size(), 4u) << "the bulk and its entries share an id";
  EXPECT_EQ(ids.count(0), 0u);

  auto r = table.Take(bulk, static_cast<int32_t>(StatusCode::kInvalidArgument));
  ASSERT_TRUE(r.found);
  ASSERT_EQ(r.refused.size(), 3u);
  for (auto& e : r.refused) {
    EXPECT_EQ(e.bulk_id, bulk);
    Answer(e, InvalidArgumentError("bulk did not parse"));
  }
  EXPECT_EQ(table.size(), 0u);
  EXPECT_EQ(replies.ran.size(), 3u);
  // The entries' own answers, were any to come, find nothing: each reply ran once.
  for (uint64_t id = first; id < first + 3; ++id) EXPECT_FALSE(table.Take(id, 0).found);
}

TEST(PendingAnswers, OnceAnEntryIsAnsweredTheBulkCannotBeRefused) {
  PendingAnswers table;
  Replies replies;
  uint64_t first = 0;
  const uint64_t bulk = AddPairBulk(table, replies, &first);
  auto e0 = table.Take(first, 0);
  ASSERT_TRUE(e0.found);
  Answer(e0.entry, Status::Ok());
  // The server took the bulk: an error under the bulk's id is not about these entries.
  auto late = table.Take(bulk, static_cast<int32_t>(StatusCode::kInternal));
  EXPECT_FALSE(late.found);
  EXPECT_TRUE(late.refused.empty());
  auto e1 = table.Take(first + 1, static_cast<int32_t>(StatusCode::kFailedPrecondition));
  ASSERT_TRUE(e1.found);
  Answer(e1.entry, FailedPreconditionError("its own error"));
  EXPECT_EQ(replies.ran, (std::vector<std::string>{"e0:0", "e1:9"}));
}

TEST(PendingAnswers, AnOkAnswerUnderTheBulkIdLeavesTheEntriesPending) {
  PendingAnswers table;
  Replies replies;
  uint64_t first = 0;
  const uint64_t bulk = AddPairBulk(table, replies, &first);
  auto r = table.Take(bulk, 0);
  EXPECT_FALSE(r.found);
  EXPECT_TRUE(r.refused.empty());
  EXPECT_EQ(table.size(), 2u);
}

TEST(PendingAnswers, TakeAllHandsOverEverythingAndIdsAreNeverReused) {
  PendingAnswers table;
  Replies replies;
  std::set<uint64_t> ids;
  ids.insert(table.Add(SliceRequest{}, replies.For("a")));
  uint64_t first = 0;
  ids.insert(AddPairBulk(table, replies, &first));
  ids.insert(first);
  ids.insert(first + 1);
  auto all = table.TakeAll();
  ASSERT_EQ(all.size(), 3u);
  for (auto& e : all) Answer(e, UnavailableError("connection ended"));
  EXPECT_EQ(replies.ran.size(), 3u);
  EXPECT_EQ(table.size(), 0u);
  // Nothing left to answer, nothing left to refuse.
  for (uint64_t id : ids) EXPECT_FALSE(table.Take(id, 13).found);
  // A late answer to an old id can never be taken for a new request.
  const uint64_t next = table.Add(SliceRequest{}, replies.For("b"));
  EXPECT_EQ(ids.count(next), 0u);
}

}  // namespace
}  // namespace trellis
