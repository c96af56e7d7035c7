// Panel GEMM, AVX-512F: Y[t, r] = dot(W[r], X[t]) for a panel of nr <= kPanelRows decoded
// weight rows and T tokens, as an outer product. The panel is first laid out k-major, its 48 rows
// side by side (Wt[k][48], zero rows past nr), so one k step is 3 vectors of weights times 8
// broadcast activations: 24 accumulators, 3 weight and 1 broadcast register of the 32, and no
// horizontal sums (the AVX2 kernel's dot-product form spends a load per FMA pair and a reduction
// per output). k runs in blocks of kKBlock so a block of Wt (48 x 1024 floats, 192 KB) stays in
// L2 and the 8 tokens' slice of X (32 KB) in L1 while all tokens pass over it; each output
// accumulates its k in order, whatever T is and whatever the block (batch invariant). Blocks of
// 256 columns paid their accumulators' reload and store 4x as often.
#include <immintrin.h>

#include "aligned.h"
#include "kernels.h"
#include "kernels/avx512/simd.h"
#include "linear.h"

namespace sl::avx512 {

static_assert(kPanelRows == 48, "the micro-kernel covers a panel's 48 rows");
constexpr int kVecs = kPanelRows / 16;
constexpr int kTokens = 8;
constexpr int64_t kKBlock = 1024;

template <int C>
static inline void micro(const float* Wt, const float* X, int64_t ldx, int64_t kb, float* Y,
                         int64_t ldy, const __mmask16* masks, bool accumulate) {
  __m512 acc[kVecs][C];
  for (int j = 0; j < C; ++j)
    for (int i = 0; i < kVecs; ++i)
      acc[i][j] = accumulate ? _mm512_maskz_loadu_ps(masks[i], Y + j * ldy + 16 * i)
                             : _mm512_setzero_ps();
  for (int64_t p = 0; p < kb; ++p) {
    __m512 w[kVecs];
    for (int i = 0; i < kVecs; ++i) w[i] = _mm512_load_ps(Wt + p * kPanelRows + 16 * i);
    for (int j = 0; j < C; ++j) {
      const __m512 x = _mm512_set1_ps(X[j * ldx + p]);
      for (int i = 0; i < kVecs; ++i) acc[i][j] = _mm512_fmadd_ps(w[i], x, acc[i][j]);
    }
  }
  for (int j = 0; j < C; ++j)
    for (int i = 0; i < kVecs; ++i)
      _mm512_mask_storeu_ps(Y + j * ldy + 16 * i, masks[i], acc[i][j]);
}

using MicroFn = void (*)(const float*, const float*, int64_t, int64_t, float*, int64_t,
                         const __mmask16*, bool);
static constexpr MicroFn kMicro[kTokens + 1] = {nullptr,  micro<1>, micro<2>, micro<3>,
                                                micro<4>, micro<5>, micro<6>, micro<7>,
                                                micro<8>};

void panel_gemm(const PanelRows& W, const float* X, int64_t ldx, int64_t T, float* Y,
                int64_t ldy) {
  const int64_t k = W.w.kp, nr = W.nr;
  thread_local AlignedVector<float> packed, rows16;
  if (packed.size() < size_t(kPanelRows * k)) packed.resize(size_t(kPanelRows * k));
  if (rows16.size() < size_t(16 * k)) rows16.resize(size_t(16 * k));
  float* Wt = packed.data();
  // k-major, 16 rows at a time (decoded into rows16, which stays in L2), 16 x 16 blocks
  // transposed in registers (k is a multiple of 64); rows past nr zero
  for (int i = 0; i < kVecs; ++i) {
    const int64_t left = nr - 16 * i, n = left <= 0 ? 0 : left < 16 ? left : 16;
    const float* src = n ? W.rows(16 * i, n, rows16.data()) : nullptr;
    for (int64_t p = 0; p < k; p += 16) {
      __m512 r[16];
      for (int j = 0; j < 16; ++j)
        r[j] = j < n ? _mm512_loadu_ps(src + j * k + p) : _mm512_setzero_ps();
      transpose16(r);
      for (int j = 0; j < 16; ++j) _mm512_store_ps(Wt + (p + j) * kPanelRows + 16 * i, r[j]);
    }
  }
  // Outputs past nr are not this panel's: each vector stores only its rows below nr.
  __mmask16 masks[kVecs];
  for (int i = 0; i < kVecs; ++i) {
    const int64_t n = nr - 16 * i;
    masks[i] = n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
  }
  for (int64_t k0 = 0; k0 < k; k0 += kKBlock) {
    const int64_t kb = k0 + kKBlock < k ? kKBlock : k - k0;
    for (int64_t t = 0; t < T; t += kTokens) {
      const int64_t c = T - t < kTokens ? T - t : kTokens;
      kMicro[c](Wt + k0 * kPanelRows, X + t * ldx + k0, ldx, kb, Y + t * ldy, ldy, masks,
                k0 > 0);
    }
  }
}

}  // namespace sl::avx512
