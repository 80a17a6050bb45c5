#include "datapath/frame.h"

#include "datapath/le_bytes.h"

#include <algorithm>
#include <cstring>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace trellis::wire {
namespace {


// Walks chunked bytes from an offset, handing out contiguous spans.
class Cursor {
 public:
  Cursor(const Chunks& chunks, size_t offset) : chunks_(chunks) {
    while (i_ < chunks_.size() && offset >= chunks_[i_].size()) offset -= chunks_[i_++].size();
    pos_ = offset;
  }
  // The next contiguous run of at most `max` bytes (empty at the end).
  std::span<const uint8_t> Next(size_t max) {
    while (i_ < chunks_.size() && pos_ == chunks_[i_].size()) {
      ++i_;
      pos_ = 0;
    }
    if (i_ == chunks_.size()) return {};
    size_t n = std::min(max, chunks_[i_].size() - pos_);
    auto s = chunks_[i_].subspan(pos_, n);
    pos_ += n;
    return s;
  }

 private:
  const Chunks& chunks_;
  size_t i_ = 0;
  size_t pos_ = 0;
};

// d[i] += the float whose bytes start at s + 4 * i, for i < n; s has no alignment. Each element
// is one float addition d[i] + v, as a scalar loop does (same bits); SSE2 does four at a time
// straight from the received bytes (the sum of the step's last push is on the step's critical
// path: a scalar loop over a copy into scratch cost the server ~20 ms per 100 MB).
void AddBytesAsFloats(const uint8_t* s, size_t n, float* d) {
  size_t i = 0;
#if defined(__SSE2__)
  for (; i + 8 <= n; i += 8) {
    const __m128 a = _mm_loadu_ps(reinterpret_cast<const float*>(s + 4 * i));
    const __m128 b = _mm_loadu_ps(reinterpret_cast<const float*>(s + 4 * i + 16));
    _mm_storeu_ps(d + i, _mm_add_ps(_mm_loadu_ps(d + i), a));
    _mm_storeu_ps(d + i + 4, _mm_add_ps(_mm_loadu_ps(d + i + 4), b));
  }
#endif
  for (; i < n; ++i) {
    float v;
    std::memcpy(&v, s + 4 * i, sizeof v);
    d[i] += v;
  }
}

}  // namespace

const char* OpName(Op op) {
  switch (op) {
    case Op::kPush: return "push";
    case Op::kPull: return "pull";
    case Op::kPushPull: return "pushpull";
    case Op::kInit: return "init";
    case Op::kBulk: return "bulk";
    case Op::kSave: return "save";
    case Op::kLoad: return "load";
    case Op::kRejoin: return "rejoin";
    case Op::kStash: return "stash";
    case Op::kFetch: return "fetch";
    case Op::kPushTwoBit: return "push2bit";
    case Op::kPushPullTwoBit: return "pushpull2bit";
    case Op::kPullPacked: return "pullpacked";
    case Op::kPushPullTwoBitPacked: return "pushpull2bitpacked";
    case Op::kReplay: return "replay";
    case Op::kWorld: return "world";
    case Op::kHandOut: return "handout";
    case Op::kHandIn: return "handin";
  }
  return "op(?)";
}

size_t TotalBytes(const Chunks& chunks) {
  size_t n = 0;
  for (const auto& c : chunks) n += c.size();
  return n;
}

void CopyOut(const Chunks& chunks, size_t offset, size_t n, void* dst) {
  Cursor cur(chunks, offset);
  auto* d = static_cast<uint8_t*>(dst);
  while (n > 0) {
    auto s = cur.Next(n);
    if (s.empty()) return;
    std::memcpy(d, s.data(), s.size());
    d += s.size();
    n -= s.size();
  }
}

const uint8_t* Contiguous(const Chunks& chunks, size_t offset, size_t n,
                          std::vector<uint8_t>* scratch) {
  size_t at = offset;
  for (const auto& c : chunks) {
    if (at < c.size()) {
      if (c.size() - at >= n) return c.data() + at;
      break;
    }
    at -= c.size();
  }
  scratch->resize(n);
  CopyOut(chunks, offset, n, scratch->data());
  return scratch->data();
}

void CopyFloats(const Chunks& chunks, size_t offset, size_t count, float* dst) {
  CopyOut(chunks, offset, count * sizeof(float), dst);
}

void AddFloats(const Chunks& chunks, size_t offset, size_t count, float* dst) {
  Cursor cur(chunks, offset);
  size_t done = 0;
  while (done < count) {
    auto s = cur.Next((count - done) * sizeof(float));
    if (s.empty()) return;  // REQUIRES violated; callers check lengths first
    const size_t whole = s.size() / sizeof(float);
    AddBytesAsFloats(s.data(), whole, dst + done);
    done += whole;
    size_t got = s.size() - whole * sizeof(float);
    if (got == 0) continue;
    // A float straddling chunks: its bytes stitched together.
    uint8_t b[sizeof(float)];
    std::memcpy(b, s.data() + whole * sizeof(float), got);
    while (got < sizeof b) {
      auto t = cur.Next(sizeof b - got);
      if (t.empty()) return;
      std::memcpy(b + got, t.data(), t.size());
      got += t.size();
    }
    AddBytesAsFloats(b, 1, dst + done);
    ++done;
  }
}

Status ParseRequestHeader(const uint8_t* h, RequestHeader* out) {
  uint32_t magic = GetLe<uint32_t>(h, 0);
  if (magic != kRequestMagic) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%08x", magic);
    return InvalidArgumentError(std::string("malformed frame: bad magic ") + buf +
                                " (not a trellis data request)");
  }
  uint8_t op = GetLe<uint8_t>(h, 4);
  if (!IsKnownOp(op)) {
    return InvalidArgumentError("malformed frame: unknown op " + std::to_string(op));
  }
  out->op = static_cast<Op>(op);
  out->request_id = GetLe<uint64_t>(h, 8);
  out->key = GetLe<uint64_t>(h, 16);
  out->step = GetLe<int64_t>(h, 24);
  out->slice = GetLe<uint32_t>(h, 32);
  out->priority = GetLe<int32_t>(h, 36);
  out->payload_bytes = GetLe<uint64_t>(h, 40);
  return Status::Ok();
}

Status ParseResponseHeader(const uint8_t* h, ResponseHeader* out) {
  if (GetLe<uint32_t>(h, 0) != kResponseMagic) return DataLossError("malformed response: bad magic");
  out->op = static_cast<Op>(GetLe<uint8_t>(h, 4));
  const uint8_t encoding = GetLe<uint8_t>(h, 5);
  if (encoding > 1) {
    return DataLossError("malformed response: unknown payload encoding " +
                         std::to_string(encoding));
  }
  out->packed = encoding == 1;
  out->request_id = GetLe<uint64_t>(h, 8);
  out->code = GetLe<int32_t>(h, 16);
  out->message_bytes = GetLe<uint32_t>(h, 20);
  out->payload_bytes = GetLe<uint64_t>(h, 24);
  return Status::Ok();
}

std::vector<uint8_t> EncodeWorldMembers(const std::vector<int32_t>& members) {
  std::vector<uint8_t> out(members.size() * sizeof(int32_t));
  for (size_t i = 0; i < members.size(); ++i) {
    PutLe<int32_t>(out.data(), i * sizeof(int32_t), members[i]);
  }
  return out;
}

StatusOr<std::vector<int32_t>> ParseWorldMembers(const Chunks& frame, size_t offset,
                                                 uint64_t bytes, int32_t slots) {
  if (bytes % sizeof(int32_t) != 0) {
    return InvalidArgumentError("world: payload of " + std::to_string(bytes) +
                                " bytes is not a whole number of int32 worker ranks");
  }
  if (bytes / sizeof(int32_t) > static_cast<uint64_t>(slots)) {
    return InvalidArgumentError("world: " + std::to_string(bytes / sizeof(int32_t)) +
                                " workers named, the job has " + std::to_string(slots) +
                                " worker ranks");
  }
  std::vector<uint8_t> raw(bytes);
  CopyOut(frame, offset, bytes, raw.data());
  std::vector<int32_t> members(bytes / sizeof(int32_t));
  for (size_t i = 0; i < members.size(); ++i) {
    members[i] = GetLe<int32_t>(raw.data(), i * sizeof(int32_t));
  }
  return members;
}

void EncodeRequestHeader(const RequestHeader& h, uint8_t out[kRequestHeaderBytes]) {
  std::memset(out, 0, kRequestHeaderBytes);
  PutLe<uint32_t>(out, 0, kRequestMagic);
  PutLe<uint8_t>(out, 4, static_cast<uint8_t>(h.op));
  PutLe<uint64_t>(out, 8, h.request_id);
  PutLe<uint64_t>(out, 16, h.key);
  PutLe<int64_t>(out, 24, h.step);
  PutLe<uint32_t>(out, 32, h.slice);
  PutLe<int32_t>(out, 36, h.priority);
  PutLe<uint64_t>(out, 40, h.payload_bytes);
}

void EncodeResponseHeader(const ResponseHeader& h, uint8_t out[kResponseHeaderBytes]) {
  std::memset(out, 0, kResponseHeaderBytes);
  PutLe<uint32_t>(out, 0, kResponseMagic);
  PutLe<uint8_t>(out, 4, static_cast<uint8_t>(h.op));
  PutLe<uint8_t>(out, 5, h.packed ? 1 : 0);
  PutLe<uint64_t>(out, 8, h.request_id);
  PutLe<int32_t>(out, 16, h.code);
  PutLe<uint32_t>(out, 20, h.message_bytes);
  PutLe<uint64_t>(out, 24, h.payload_bytes);
}

Status DecodeRequest(const Chunks& frame, RequestHeader* out, uint64_t* request_id) {
  *request_id = 0;
  size_t total = TotalBytes(frame);
  uint8_t h[kRequestHeaderBytes] = {};
  CopyOut(frame, 0, std::min(total, kRequestHeaderBytes), h);
  if (total >= 16) *request_id = GetLe<uint64_t>(h, 8);
  if (total < kRequestHeaderBytes) {
    return InvalidArgumentError("malformed frame: " + std::to_string(total) +
                                " bytes, shorter than the " +
                                std::to_string(kRequestHeaderBytes) + "-byte request header");
  }
  TRELLIS_RETURN_IF_ERROR(ParseRequestHeader(h, out));
  uint64_t present = total - kRequestHeaderBytes;
  if (out->payload_bytes != present) {
    return InvalidArgumentError("malformed frame: header announces " +
                                std::to_string(out->payload_bytes) + " payload bytes, " +
                                std::to_string(present) + " present (truncated or padded)");
  }
  if (!OpHasPayload(out->op) && present != 0) {
    return InvalidArgumentError(std::string("malformed frame: a ") + OpName(out->op) +
                                " carries no payload, got " + std::to_string(present) + " bytes");
  }
  if (PayloadIsFloat32(out->op) && present % sizeof(float) != 0) {
    return InvalidArgumentError("malformed frame: payload of " + std::to_string(present) +
                                " bytes is not a whole number of float32 values");
  }
  return Status::Ok();
}

Status DecodeResponse(const Chunks& frame, ResponseHeader* out, std::string* message) {
  size_t total = TotalBytes(frame);
  if (total < kResponseHeaderBytes) {
    return DataLossError("malformed response: " + std::to_string(total) + " bytes");
  }
  uint8_t h[kResponseHeaderBytes];
  CopyOut(frame, 0, kResponseHeaderBytes, h);
  TRELLIS_RETURN_IF_ERROR(ParseResponseHeader(h, out));
  if (kResponseHeaderBytes + uint64_t{out->message_bytes} + out->payload_bytes != total) {
    return DataLossError("malformed response: lengths do not add up to " + std::to_string(total));
  }
  message->resize(out->message_bytes);
  CopyOut(frame, kResponseHeaderBytes, out->message_bytes, message->data());
  return Status::Ok();
}

Chunks SubChunks(const Chunks& chunks, size_t offset, size_t n) {
  Chunks out;
  for (const auto& c : chunks) {
    if (n == 0) break;
    if (offset >= c.size()) {
      offset -= c.size();
      continue;
    }
    const size_t take = std::min(n, c.size() - offset);
    out.push_back(c.subspan(offset, take));
    offset = 0;
    n -= take;
  }
  return out;
}

Status ParseBulk(const Chunks& frame, size_t offset, uint64_t bytes, std::vector<BulkEntry>* out) {
  out->clear();
  const uint64_t end = offset + bytes;
  if (end > TotalBytes(frame)) {
    return InvalidArgumentError("malformed bulk: body of " + std::to_string(bytes) +
                                " bytes runs past the frame");
  }
  uint64_t at = offset;
  while (at < end) {
    const std::string where = "malformed bulk: entry " + std::to_string(out->size());
    if (out->size() >= kMaxBulkEntries) {
      return InvalidArgumentError("malformed bulk: more than " + std::to_string(kMaxBulkEntries) +
                                  " entries");
    }
    if (end - at < kRequestHeaderBytes) {
      return InvalidArgumentError(where + ": " + std::to_string(end - at) +
                                  " bytes left, shorter than a request header");
    }
    uint8_t h[kRequestHeaderBytes];
    CopyOut(frame, at, kRequestHeaderBytes, h);
    BulkEntry e;
    if (Status st = ParseRequestHeader(h, &e.header); !st.ok()) {
      return InvalidArgumentError(where + ": " + st.message());
    }
    const RequestHeader& eh = e.header;
    if (eh.op == Op::kBulk || eh.op == Op::kInit || IsReplay(eh.op) || eh.op == Op::kWorld ||
        IsHandoverOp(eh.op) || IsRejoinOp(static_cast<uint8_t>(eh.op))) {
      return InvalidArgumentError(where + ": op " + OpName(eh.op) + " cannot travel in a bulk");
    }
    if (eh.payload_bytes > end - at - kRequestHeaderBytes) {
      return InvalidArgumentError(where + ": payload of " + std::to_string(eh.payload_bytes) +
                                  " bytes runs past the bulk");
    }
    if ((eh.op == Op::kPull || eh.op == Op::kPullPacked) && eh.payload_bytes != 0) {
      return InvalidArgumentError(where + ": a " + OpName(eh.op) + " carries no payload, got " +
                                  std::to_string(eh.payload_bytes) + " bytes");
    }
    if (PayloadIsFloat32(eh.op) && eh.payload_bytes % sizeof(float) != 0) {
      return InvalidArgumentError(where + ": payload of " + std::to_string(eh.payload_bytes) +
                                  " bytes is not a whole number of float32 values");
    }
    e.offset = at;
    e.bytes = kRequestHeaderBytes + eh.payload_bytes;
    at += e.bytes;
    out->push_back(e);
  }
  if (out->empty()) return InvalidArgumentError("malformed bulk: no entries");
  return Status::Ok();
}

std::vector<uint8_t> EncodeStatusFrame(Op op, uint64_t request_id, const Status& st) {
  std::string msg = st.message().substr(0, kMaxErrorBytes);
  ResponseHeader h;
  h.op = op;
  h.request_id = request_id;
  h.code = static_cast<int32_t>(st.code());
  h.message_bytes = static_cast<uint32_t>(msg.size());
  std::vector<uint8_t> out(kResponseHeaderBytes + msg.size());
  EncodeResponseHeader(h, out.data());
  std::memcpy(out.data() + kResponseHeaderBytes, msg.data(), msg.size());
  return out;
}

}  // namespace trellis::wire
