// Int4 group-wise GEMV (fp32 activations), portable scalar reference.
// w[k] = (q[k] - z_g) * s_g for column k in group g, so per group
//   sum_k w[k] x[k] = s_g * (sum_k q[k] x[k] - z_g * sum_k x[k]);
// the group sums of x (Act::gsum) are computed once per token and shared by every row.
#include "common.h"

namespace sl::scalar {

void gemv_i4(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1) {
  const uint8_t* W = static_cast<const uint8_t*>(w.data);
  const int64_t ng = w.kp / w.group, bpg = w.group / 32;  // groups per row, 32-blocks per group
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = W + r * (w.kp / 2);
    float acc = 0.f;
    for (int64_t g = 0; g < ng; ++g) {
      float dot = 0.f;
      for (int64_t b = 0; b < bpg; ++b) {
        const uint8_t* blk = row + (g * bpg + b) * 16;
        const float* x = a.x + (g * bpg + b) * 32;
        for (int j = 0; j < 16; ++j)
          dot += float(blk[j] & 15) * x[j] + float(blk[j] >> 4) * x[j + 16];
      }
      const float z = w.asym ? float(w.zero[r * ng + g]) : 8.f;
      acc += w.scale[r * ng + g] * (dot - z * a.gsum[g]);
    }
    y[r] = acc;
  }
}

// W4A8: int8 activations, exact integer dot per group, one float FMA per group.
void gemv_i4a8(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1) {
  const uint8_t* W = static_cast<const uint8_t*>(w.data);
  const int64_t ng = w.kp / w.group, bpg = w.group / 32;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = W + r * (w.kp / 2);
    float acc = 0.f;
    for (int64_t g = 0; g < ng; ++g) {
      int32_t dot = 0;
      for (int64_t b = 0; b < bpg; ++b) {
        const uint8_t* blk = row + (g * bpg + b) * 16;
        const int8_t* x = a.xq + (g * bpg + b) * 32;
        for (int j = 0; j < 16; ++j) dot += (blk[j] & 15) * x[j] + (blk[j] >> 4) * x[j + 16];
      }
      const float z = w.asym ? float(w.zero[r * ng + g]) : 8.f;
      acc += w.scale[r * ng + g] * (float(dot) - z * a.gsum[g]);
    }
    y[r] = acc * a.xscale;
  }
}

}  // namespace sl::scalar
