// Int4 group-wise GEMV, portable scalar reference.
// w[k] = (q[k] - z_g) * s_g for column k in group g, so per group
//   sum_k w[k] x[k] = s_g * (sum_k q[k] x[k] - z_g * sum_k x[k]);
// the group sums of x (Acts::gsum) are computed once per token and shared by every row.
// W4A8 (gemv_i4a8): int8 activations, exact integer dot per group, one float FMA per group.
// I4K (Q4_K's form, weight.h): s_g and m_g = dmin * m from the superblock, and
//   sum_k w[k] x[k] = s_g * sum_k q[k] x[k] - m_g * sum_k x[k].
#include "kernels.h"
#include "kernels/tiles.h"

namespace sl::scalar {

// One kernel for both activation types: X is float (W4A16) or int8_t (W4A8, Dot = int32_t),
// and both scale forms (K: I4K's superblocks).
template <typename X, typename Dot, bool K>
static void gemv_i4_rows(const Weight& w, const Acts& a, const X* xs, float* y, int64_t ldy,
                         int64_t r0, int64_t r1) {
  const uint8_t* W = static_cast<const uint8_t*>(w.data);
  const int64_t kp = w.kp, ng = kp / w.group, bpg = w.group / 32;  // 32-blocks per group
  for_rows_and_tiles<4>(r0, r1, a.T, [&](auto nt, int64_t r, int64_t t0) {
    constexpr int NT = decltype(nt)::value;
    const uint8_t* row = W + r * (kp / 2);
    float acc[NT] = {};
    for (int64_t g = 0; g < ng; ++g) {
      Dot dot[NT] = {};
      for (int64_t b = 0; b < bpg; ++b) {
        const uint8_t* blk = row + (g * bpg + b) * 16;
        for (int j = 0; j < 16; ++j)
          for (int t = 0; t < NT; ++t) {
            const X* x = xs + (t0 + t) * kp + (g * bpg + b) * 32;
            dot[t] += Dot(blk[j] & 15) * Dot(x[j]) + Dot(blk[j] >> 4) * Dot(x[j + 16]);
          }
      }
      if constexpr (K) {
        const float s = i4k_scale(w, r, g), m = i4k_min(w, r, g);
        for (int t = 0; t < NT; ++t)
          acc[t] += s * float(dot[t]) - m * a.gsum[(t0 + t) * ng + g];
      } else {
        const float z = w.asym ? float(w.zero[r * ng + g]) : 8.f;
        for (int t = 0; t < NT; ++t)
          acc[t] += w.scale[r * ng + g] * (float(dot[t]) - z * a.gsum[(t0 + t) * ng + g]);
      }
    }
    for (int t = 0; t < NT; ++t)
      y[(t0 + t) * ldy + r] = w.act_int8 ? acc[t] * a.xscale[t0 + t] : acc[t];
  });
}

void gemv_i4(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  gemv_i4_rows<float, float, false>(w, a, a.x, y, ldy, r0, r1);
}

void gemv_i4a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  gemv_i4_rows<int8_t, int32_t, false>(w, a, a.xq, y, ldy, r0, r1);
}

void gemv_i4k(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  gemv_i4_rows<float, float, true>(w, a, a.x, y, ldy, r0, r1);
}

void gemv_i4ka8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  gemv_i4_rows<int8_t, int32_t, true>(w, a, a.xq, y, ldy, r0, r1);
}

}  // namespace sl::scalar
