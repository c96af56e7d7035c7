// Int8 per-output-channel GEMV with int8 activations, portable scalar reference:
//  W8A8 (gemv_i8a8, Fmt::I8_R16): y[r] = scale[r] * xscale * sum_k q[r,k] * xq[k] (exact int32
//  dot).
// W8A16 (gemv_i8) widens the weights to fp32 like the float formats: gemv_dense.cpp.
#include <cmath>

#include "kernels.h"
#include "kernels/tiles.h"

namespace sl::scalar {

void quantize_row(const float* x, int64_t n, int8_t* q, float* scale) {
  // Dynamic symmetric per-token quantization on compressed-tensors' grid: scale = max|x| / 127.5,
  // xq = rint(x / scale) clamped to [-128, 127] (so -max|x| is -128 and +max|x| is 127). The
  // same float ops as compressed-tensors and the NumPy twin.
  float amax = 0.f;
  for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  *scale = amax / 127.5f;
  if (*scale == 0.f) {  // all zeros (or so tiny that the scale underflows)
    for (int64_t i = 0; i < n; ++i) q[i] = 0;
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    q[i] = int8_t(std::fmin(std::fmax(std::nearbyint(x[i] / *scale), -128.f), 127.f));
}

// W8A8 over the 16-row blocks of Fmt::I8_R16 (weight.h), one row at a time: the 4 weights of
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
