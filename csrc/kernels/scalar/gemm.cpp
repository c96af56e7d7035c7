// Panel GEMM, portable scalar reference: Y[t, r] = dot(W[r], X[t]) for a panel of W.nr weight
// rows (decoded to fp32 once, PanelRows) and T tokens. Prefill / batched decode reuse each
// decoded panel for every token, so their cost is compute, not weight bandwidth.
#include "aligned.h"
#include "kernels.h"

namespace sl::scalar {

void panel_gemm(const PanelRows& W, const float* X, int64_t ldx, int64_t T, float* Y,
                int64_t ldy) {
  thread_local AlignedVector<float> buf;
  const int64_t k = W.w.kp;
  if (buf.size() < size_t(W.nr * k)) buf.resize(size_t(W.nr * k));
  const float* rows = W.rows(0, W.nr, buf.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = 0; r < W.nr; ++r) {
      const float* w = rows + r * k;
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
