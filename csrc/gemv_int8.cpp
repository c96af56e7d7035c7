// Int8 per-output-channel GEMV, portable scalar reference.
//  W8A16 (gemv_i8):   y[r] = scale[r] * sum_k q[r,k] * x[k]          (fp32 activations)
//  W8A8  (gemv_i8a8): y[r] = scale[r] * xscale * sum_k q[r,k] * xq[k] (exact int32 dot)
#include <cmath>

#include "common.h"

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

void gemv_i8(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1) {
  const int8_t* W = static_cast<const int8_t*>(w.data);
  for (int64_t r = r0; r < r1; ++r) {
    const int8_t* row = W + r * w.kp;
    float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
    for (int64_t k = 0; k < w.kp; k += 4) {
      s0 += float(row[k + 0]) * a.x[k + 0];
      s1 += float(row[k + 1]) * a.x[k + 1];
      s2 += float(row[k + 2]) * a.x[k + 2];
      s3 += float(row[k + 3]) * a.x[k + 3];
    }
    y[r] = ((s0 + s1) + (s2 + s3)) * w.scale[r];
  }
}

void gemv_i8a8(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1) {
  const int8_t* W = static_cast<const int8_t*>(w.data);
  for (int64_t r = r0; r < r1; ++r) {
    const int8_t* row = W + r * w.kp;
    int32_t acc = 0;
    for (int64_t k = 0; k < w.kp; ++k) acc += int32_t(row[k]) * int32_t(a.xq[k]);
    y[r] = float(acc) * (a.xscale * w.scale[r]);
  }
}

}  // namespace sl::scalar
