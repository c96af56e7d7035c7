// Panel GEMM, portable scalar reference: Y[t, r] = dot(W[r], X[t]) for a panel of nr decoded
// weight rows and T tokens. Prefill / batched decode decode each weight panel once (decode_rows)
// and reuse it for every token, so their cost is compute, not weight bandwidth.
#include "common.h"

namespace sl::scalar {

void panel_gemm(const float* W, int64_t ldw, int64_t nr, const float* X, int64_t ldx, int64_t T,
                int64_t k, float* Y, int64_t ldy) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = 0; r < nr; ++r) {
      const float* w = W + r * ldw;
      const float* x = X + t * ldx;
      float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
      for (int64_t i = 0; i < k; i += 4) {
        s0 += w[i] * x[i];
        s1 += w[i + 1] * x[i + 1];
        s2 += w[i + 2] * x[i + 2];
        s3 += w[i + 3] * x[i + 3];
      }
      Y[t * ldy + r] = (s0 + s1) + (s2 + s3);
    }
}

}  // namespace sl::scalar
