#include "datapath/codec/twobit_codec.h"

#include <algorithm>
#include <string>

#include "datapath/codec/twobit.h"

namespace trellis {

StatusOr<std::unique_ptr<TwoBitCodec>> TwoBitCodec::Create(float threshold) {
  TRELLIS_RETURN_IF_ERROR(ValidateTwoBitThreshold(threshold));
  return std::unique_ptr<TwoBitCodec>(new TwoBitCodec(threshold));
}

StatusOr<TwoBitCodec::Slice*> TwoBitCodec::GetSlice(uint64_t slice, size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = slices_.try_emplace(slice);
  if (inserted) {
    it->second = std::make_unique<Slice>();
    it->second->residual.assign(n, 0.0f);  // not yet shared: no other thread has seen it
    return it->second.get();
  }
  Slice* s = it->second.get();
  std::lock_guard<std::mutex> slice_lock(s->mu);
  if (s->residual.size() != n) {
    return InvalidArgumentError("2bit slice " + std::to_string(slice) + ": " + std::to_string(n) +
                                " elements, but its residual has " + std::to_string(s->residual.size()));
  }
  return s;
}

Status TwoBitCodec::Encode(uint64_t slice, const float* grad, size_t n, uint8_t* payload, size_t payload_bytes) {
  TRELLIS_ASSIGN_OR_RETURN(Slice * s, GetSlice(slice, n));
  std::lock_guard<std::mutex> lock(s->mu);
  return TwoBitEncode(grad, s->residual.data(), n, threshold_, payload, payload_bytes);
}

Status TwoBitCodec::Encode(uint64_t slice, const float* grad, size_t n, std::vector<uint8_t>* out) {
  if (n > kTwoBitMaxElements) {
    return InvalidArgumentError("2bit slice " + std::to_string(slice) + ": " + std::to_string(n) +
                                " elements exceed the frame limit of " + std::to_string(kTwoBitMaxElements));
  }
  out->resize(TwoBitEncodedBytes(n));
  return Encode(slice, grad, n, out->data(), out->size());
}

std::vector<float> TwoBitCodec::Residual(uint64_t slice) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slices_.find(slice);
  if (it == slices_.end()) return {};
  std::lock_guard<std::mutex> slice_lock(it->second->mu);
  return it->second->residual;
}

void TwoBitCodec::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, s] : slices_) {
    std::lock_guard<std::mutex> slice_lock(s->mu);
    std::fill(s->residual.begin(), s->residual.end(), 0.0f);
  }
}

}  // namespace trellis
