#include "datapath/codec/coded_frame.h"

namespace trellis {

StatusOr<CodedFrame> ParseCodedFrame(const uint8_t* payload, size_t bytes, size_t expected_count) {
  CodedFrame f;
  const bool half = bytes >= 4 && payload[0] == (kHalfMagic & 0xFF) &&
                    payload[1] == ((kHalfMagic >> 8) & 0xFF) &&
                    payload[2] == ((kHalfMagic >> 16) & 0xFF) && payload[3] == (kHalfMagic >> 24);
  if (half) {
    TRELLIS_ASSIGN_OR_RETURN(f.half, HalfParse(payload, bytes, expected_count));
    f.is_half = true;
  } else {
    TRELLIS_ASSIGN_OR_RETURN(f.twobit, TwoBitParse(payload, bytes, expected_count));
  }
  return f;
}

void DecodeCodedFrame(const CodedFrame& f, float* out) {
  if (f.is_half) {
    HalfDecodeFrame(f.half, out);
  } else {
    TwoBitDequantizeFrame(f.twobit, out);
  }
}

void DecodeAddCodedFrame(const CodedFrame& f, float* acc) {
  if (f.is_half) {
    HalfDecodeAddFrame(f.half, acc);
  } else {
    TwoBitDequantizeAddFrame(f.twobit, acc);
  }
}

}  // namespace trellis
