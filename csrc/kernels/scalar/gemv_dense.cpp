// GEMV of weights that widen to fp32 (fp32 / fp16 / bf16, and int8 W8A16 with a per-row
// scale), portable scalar reference. Weights are row-major (rows, kp); every product is
// accumulated in fp32 whatever the storage type. Token tiling: tiles.h.
#include "half.h"
#include "kernels.h"
#include "kernels/tiles.h"

namespace sl::scalar {

// y[t, r] = row_scale(r) * dot(W[r], x[t]), W[r][k] = load(r * kp + k).
template <typename Load, typename RowScale>
static void gemv_rows(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0,
                      int64_t r1, Load load, RowScale row_scale) {
  const int64_t kp = w.kp;
  for_rows_and_tiles<4>(r0, r1, a.T, [&](auto nt, int64_t r, int64_t t0) {
    constexpr int NT = decltype(nt)::value;
    // Four partial sums per token: shorter dependency chains, and the same association order
    // class as the SIMD kernels (results agree to float rounding, not bit for bit).
    float s[NT][4] = {};
    for (int64_t k = 0; k < kp; k += 4)
      for (int i = 0; i < 4; ++i) {
        const float wv = load(r * kp + k + i);
        for (int t = 0; t < NT; ++t) s[t][i] += wv * a.x[(t0 + t) * kp + k + i];
      }
    for (int t = 0; t < NT; ++t)
      y[(t0 + t) * ldy + r] = ((s[t][0] + s[t][1]) + (s[t][2] + s[t][3])) * row_scale(r);
  });
}

static float unscaled(int64_t) { return 1.f; }

void gemv_f32(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const float* W = static_cast<const float*>(w.data);
  gemv_rows(w, a, y, ldy, r0, r1, [W](int64_t i) { return W[i]; }, unscaled);
}

void gemv_f16(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const uint16_t* W = static_cast<const uint16_t*>(w.data);
  gemv_rows(w, a, y, ldy, r0, r1, [W](int64_t i) { return half_to_float(W[i]); }, unscaled);
}

void gemv_bf16(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const uint16_t* W = static_cast<const uint16_t*>(w.data);
  gemv_rows(w, a, y, ldy, r0, r1, [W](int64_t i) { return bf16_to_float(W[i]); }, unscaled);
}

void gemv_i8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const int8_t* W = static_cast<const int8_t*>(w.data);
  gemv_rows(w, a, y, ldy, r0, r1, [W](int64_t i) { return float(W[i]); },
            [&w](int64_t r) { return w.scale[r]; });
}

}  // namespace sl::scalar
