// Panel GEMM, AVX2+FMA: Y[t, r] = dot(W[r], X[t]) for a panel of nr <= kPanelRows decoded
// weight rows and T tokens, as an outer product (the AVX-512 kernel's form). The panel is first
// laid out k-major, its 48 rows side by side (Wt[k][48], zero rows past nr); the micro-kernel
// takes 16 of them x 6 tokens: per k step 2 weight vectors times 6 broadcast activations, 12
// accumulators + 2 weight + 1 broadcast registers of the 16 ymm, and no horizontal sums. k runs
// in blocks of kKBlock, so a block of Wt (48 x 1024 floats, 192 KB) stays in L2 and the 6
// tokens' slice of X (24 KB) in L1 while the 48 rows pass over it. Each output sums its k in
// order within a block and adds the blocks in order, whatever T is (batch invariant). A
// dot-product form (a few rows x tokens of 8-lane partial sums) would stream the tokens' X from
// L2, or from L3 at long k, once per few rows.
#include <immintrin.h>

#include "aligned.h"
#include "kernels.h"
#include "linear.h"
#include "kernels/avx2/simd.h"

namespace sl::avx2 {

static_assert(kPanelRows == 48, "a panel is 3 groups of the micro-kernel's 16 rows");
constexpr int kGroups = kPanelRows / 16;
constexpr int kTokens = 6;
constexpr int64_t kKBlock = 1024;

// Rows past the panel's nr are computed (zero weights) but not stored: per 8-row vector a
// maskload / maskstore mask.
struct RowMasks {
  __m256i m[2 * kGroups];
};

template <int C>
static inline void micro(const float* Wt, const float* X, int64_t ldx, int64_t kb, float* Y,
                         int64_t ldy, const __m256i* masks, bool accumulate) {
  __m256 a0[C], a1[C];  // rows 0-7, 8-15
  for (int j = 0; j < C; ++j) a0[j] = a1[j] = _mm256_setzero_ps();
  // kb >= 1. (As a for loop, which may run zero times, GCC 12 stored every accumulator to the
  // stack on every step, and so it did with one 2-D accumulator array: half the speed.)
  int64_t p = 0;
  do {
    const __m256 w0 = _mm256_load_ps(Wt + p * kPanelRows);
    const __m256 w1 = _mm256_load_ps(Wt + p * kPanelRows + 8);
    for (int j = 0; j < C; ++j) {
      const __m256 x = _mm256_broadcast_ss(X + j * ldx + p);
      a0[j] = _mm256_fmadd_ps(w0, x, a0[j]);
      a1[j] = _mm256_fmadd_ps(w1, x, a1[j]);
    }
  } while (++p < kb);
  for (int j = 0; j < C; ++j) {
    float* y = Y + j * ldy;
    __m256 s0 = a0[j], s1 = a1[j];
    if (accumulate) {
      s0 = _mm256_add_ps(_mm256_maskload_ps(y, masks[0]), s0);
      s1 = _mm256_add_ps(_mm256_maskload_ps(y + 8, masks[1]), s1);
    }
    _mm256_maskstore_ps(y, masks[0], s0);
    _mm256_maskstore_ps(y + 8, masks[1], s1);
  }
}

using MicroFn = void (*)(const float*, const float*, int64_t, int64_t, float*, int64_t,
                         const __m256i*, bool);
static constexpr MicroFn kMicro[kTokens + 1] = {nullptr,  micro<1>, micro<2>, micro<3>,
                                                micro<4>, micro<5>, micro<6>};

void panel_gemm(const PanelRows& W, const float* X, int64_t ldx, int64_t T, float* Y,
                int64_t ldy) {
  const int64_t k = W.w.kp, nr = W.nr;
  thread_local AlignedVector<float> packed, rows8;
  if (packed.size() < size_t(kPanelRows * k)) packed.resize(size_t(kPanelRows * k));
  if (rows8.size() < size_t(8 * k)) rows8.resize(size_t(8 * k));
  float* Wt = packed.data();
  // k-major, 8 rows at a time (decoded into rows8, which stays in L2), 8 x 8 blocks transposed
  // in registers (k is a multiple of 8); rows past nr zero
  for (int i = 0; i < 2 * kGroups; ++i) {
    const int64_t left = nr - 8 * i, n = left <= 0 ? 0 : left < 8 ? left : 8;
    const float* src = n ? W.rows(8 * i, n, rows8.data()) : nullptr;
    for (int64_t p = 0; p < k; p += 8) {
      __m256 r[8];
      for (int j = 0; j < 8; ++j)
        r[j] = j < n ? _mm256_loadu_ps(src + j * k + p) : _mm256_setzero_ps();
      transpose8(r);
      for (int j = 0; j < 8; ++j) _mm256_store_ps(Wt + (p + j) * kPanelRows + 8 * i, r[j]);
    }
  }
  RowMasks rm;
  for (int i = 0; i < 2 * kGroups; ++i) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    rm.m[i] = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(nr - 8 * i)), lane);
  }
  for (int64_t k0 = 0; k0 < k; k0 += kKBlock) {
    const int64_t kb = k0 + kKBlock < k ? kKBlock : k - k0;
    for (int64_t t = 0; t < T; t += kTokens) {  // the tile's X slice stays in L1 for all rows
      const int64_t c = T - t < kTokens ? T - t : kTokens;
      for (int g = 0; g < kGroups && 16 * g < nr; ++g)
        kMicro[c](Wt + k0 * kPanelRows + 16 * g, X + t * ldx + k0, ldx, kb,
                  Y + t * ldy + 16 * g, ldy, rm.m + 2 * g, k0 > 0);
    }
  }
}

}  // namespace sl::avx2
