// Panel GEMM, AVX2+FMA. Register block of R rows x C tokens: 3 x 4 = 12 accumulators + 3 weight
// vectors + 1 activation vector = the 16 ymm registers, 7 loads per 12 FMAs. The block's weight
// rows stay in L1 while tokens stream from L2; tokens are processed in blocks that fit L2.
#include <immintrin.h>

#include "common.h"
#include "simd_avx2.h"

namespace sl::avx2 {

template <int R, int C>
static inline void micro(const float* W, int64_t ldw, const float* X, int64_t ldx, int64_t k,
                         float* Y, int64_t ldy) {
  __m256 acc[R][C];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int64_t p = 0; p < k; p += 8) {
    __m256 w[R];
    for (int i = 0; i < R; ++i) w[i] = _mm256_loadu_ps(W + i * ldw + p);
    for (int j = 0; j < C; ++j) {
      const __m256 x = _mm256_loadu_ps(X + j * ldx + p);
      for (int i = 0; i < R; ++i) acc[i][j] = _mm256_fmadd_ps(w[i], x, acc[i][j]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < C; ++j) Y[j * ldy + i] = hsum(acc[i][j]);
}

void panel_gemm(const float* W, int64_t ldw, int64_t nr, const float* X, int64_t ldx, int64_t T,
                int64_t k, float* Y, int64_t ldy) {
  constexpr int64_t kTokBlock = 64;  // 64 tokens x kp floats stay in L2 across row blocks
  for (int64_t t0 = 0; t0 < T; t0 += kTokBlock) {
    const int64_t t1 = t0 + kTokBlock < T ? t0 + kTokBlock : T;
    int64_t r = 0;
    for (; r + 3 <= nr; r += 3) {
      int64_t t = t0;
      for (; t + 4 <= t1; t += 4)
        micro<3, 4>(W + r * ldw, ldw, X + t * ldx, ldx, k, Y + t * ldy + r, ldy);
      for (; t < t1; ++t) micro<3, 1>(W + r * ldw, ldw, X + t * ldx, ldx, k, Y + t * ldy + r, ldy);
    }
    for (; r < nr; ++r) {
      int64_t t = t0;
      for (; t + 4 <= t1; t += 4)
        micro<1, 4>(W + r * ldw, ldw, X + t * ldx, ldx, k, Y + t * ldy + r, ldy);
      for (; t < t1; ++t) micro<1, 1>(W + r * ldw, ldw, X + t * ldx, ldx, k, Y + t * ldy + r, ldy);
    }
  }
}

}  // namespace sl::avx2
