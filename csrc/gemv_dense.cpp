// Dense fp32 / fp16 / bf16 GEMV, portable scalar reference. Weights are row-major (rows, kp);
// every product is accumulated in fp32 whatever the storage type.
#include "common.h"

namespace sl::scalar {

template <typename Load>
static void gemv_rows(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1,
                      Load load) {
  const int64_t kp = w.kp;
  for (int64_t r = r0; r < r1; ++r) {
    // Four partial sums: shorter dependency chains, and the same association order class as
    // the SIMD kernels (results agree to float rounding, not bit for bit).
    float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
    for (int64_t k = 0; k < kp; k += 4) {
      s0 += load(r * kp + k + 0) * a.x[k + 0];
      s1 += load(r * kp + k + 1) * a.x[k + 1];
      s2 += load(r * kp + k + 2) * a.x[k + 2];
      s3 += load(r * kp + k + 3) * a.x[k + 3];
    }
    y[r] = (s0 + s1) + (s2 + s3);
  }
}

void gemv_f32(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1) {
  const float* W = static_cast<const float*>(w.data);
  gemv_rows(w, a, y, r0, r1, [W](int64_t i) { return W[i]; });
}

void gemv_f16(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1) {
  const uint16_t* W = static_cast<const uint16_t*>(w.data);
  gemv_rows(w, a, y, r0, r1, [W](int64_t i) { return half_to_float(W[i]); });
}

void gemv_bf16(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1) {
  const uint16_t* W = static_cast<const uint16_t*>(w.data);
  gemv_rows(w, a, y, r0, r1, [W](int64_t i) { return bf16_to_float(W[i]); });
}

}  // namespace sl::scalar
