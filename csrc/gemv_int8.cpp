// Int8 per-output-channel GEMV with int8 activations, portable scalar reference:
//  W8A8 (gemv_i8a8, Fmt::I8_R16): y[r] = scale[r] * xscale * sum_k q[r,k] * xq[k] (exact int32
//  dot).
// W8A16 (gemv_i8) widens the weights to fp32 like the float formats: gemv_dense.cpp.
#include <cmath>

#include "common.h"
#include "tiles.h"

namespace sl::scalar {

void quantize_row(const float* x, int64_t n, int8_t* q, float* scale) {
  // Dynamic symmetric per-token quantization: xq = rint(x * 127 / max|x|), in [-127, 127].
  // The same float ops (one divide, one multiply, round-half-even) as the NumPy twin.
  float amax = 0.f;
  for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  if (amax == 0.f) {
    for (int64_t i = 0; i < n; ++i) q[i] = 0;
    *scale = 0.f;
    return;
  }
  const float inv = 127.0f / amax;
  for (int64_t i = 0; i < n; ++i) q[i] = int8_t(std::nearbyint(x[i] * inv));
  *scale = amax / 127.0f;
}

// W8A8 over the 16-row blocks of Fmt::I8_R16 (common.h), one row at a time: the 4 weights of
// row r and columns k..k+3 are at byte 64 * (k / 4) + 4 * (r % 16) of its block.
void gemv_i8a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const int64_t kp = w.kp;
  for_rows_and_tiles<4>(r0, r1, a.T, [&](auto nt, int64_t r, int64_t t0) {
    constexpr int NT = decltype(nt)::value;
    const int8_t* row = r16_block(w, r / kRowBlock16) + 4 * (r % kRowBlock16);
    int32_t acc[NT] = {};
    for (int64_t k = 0; k < kp; k += 4)
      for (int j = 0; j < 4; ++j)
        for (int t = 0; t < NT; ++t)
          acc[t] += int32_t(row[16 * k + j]) * int32_t(a.xq[(t0 + t) * kp + k + j]);
    for (int t = 0; t < NT; ++t)
      y[(t0 + t) * ldy + r] = float(acc[t]) * (a.xscale[t0 + t] * w.scale[r]);
  });
}

}  // namespace sl::scalar
