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
//
// W8A8 prefill (panel_gemm_codes) runs the same kernel on integers: the int8 codes of weights
// and activations as floats. A product is at most 128 * 128 = 2^14 in magnitude, so a block's
// sums (kKBlock = 1024 products) stay within 2^24, where every integer is a float: the FMAs
// are exact, each block's sums are stored as int32 and added as int32, and a row's dot is
// the GEMV's exact int32 dot; y = float(dot) * (xscale * scale) is then the GEMV's float
// operations, so prefill gives decode's bits. It beats multiplying int16 codes with vpmaddwd
// (the form it replaced, 10% slower on Zen 1's layers): where 256-bit integer multiplies issue
// on one pipe, FMAs issue on two, so both top out at 16 products per cycle pair, and the FMA
// loop has no separate adds.
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

template <int C, bool kCodes>
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
    if constexpr (kCodes) {  // the block's exact sums, added as int32 in Y's bits
      __m256i i0 = _mm256_cvtps_epi32(a0[j]), i1 = _mm256_cvtps_epi32(a1[j]);
      if (accumulate) {
        i0 = _mm256_add_epi32(_mm256_castps_si256(_mm256_maskload_ps(y, masks[0])), i0);
        i1 = _mm256_add_epi32(_mm256_castps_si256(_mm256_maskload_ps(y + 8, masks[1])), i1);
      }
      _mm256_maskstore_ps(y, masks[0], _mm256_castsi256_ps(i0));
      _mm256_maskstore_ps(y + 8, masks[1], _mm256_castsi256_ps(i1));
      continue;
    }
    __m256 s0 = a0[j], s1 = a1[j];
    if (accumulate) {
      s0 = _mm256_add_ps(_mm256_maskload_ps(y, masks[0]), s0);
      s1 = _mm256_add_ps(_mm256_maskload_ps(y + 8, masks[1]), s1);
    }
    _mm256_maskstore_ps(y, masks[0], s0);
    _mm256_maskstore_ps(y + 8, masks[1], s1);
  }
}

// The panel's rows k-major (Wt[k][48]), 8 rows at a time: rows8(i, n) gives rows 8i .. 8i + n - 1
// (n > 0, stride kp) in a buffer that stays in L2, widen8(p) the 8 values at p as floats; 8 x 8
// blocks transposed in registers (k is a multiple of 8); rows past nr zero.
template <class Rows8, class Widen8>
static void pack_k_major(const PanelRows& W, float* Wt, Rows8 rows8, Widen8 widen8) {
  const int64_t k = W.w.kp;
  for (int i = 0; i < 2 * kGroups; ++i) {
    const int64_t left = W.nr - 8 * i, n = left <= 0 ? 0 : left < 8 ? left : 8;
    const auto* src = n ? rows8(i, n) : nullptr;
    for (int64_t p = 0; p < k; p += 8) {
      __m256 r[8];
      for (int j = 0; j < 8; ++j) r[j] = j < n ? widen8(src + j * k + p) : _mm256_setzero_ps();
      transpose8(r);
      for (int j = 0; j < 8; ++j) _mm256_store_ps(Wt + (p + j) * kPanelRows + 8 * i, r[j]);
    }
  }
}

// Row r of a bitmask (SP_I8) or 2:4 (S24_I8) int8 weight as its kp dense int8 codes, by the
// GEMVs' expansions: 16 columns per shuffle, or 64 per 2:4 block (simd.h).
static void code_row(const Weight& w, int64_t r, int8_t* out) {
  const int8_t* v = static_cast<const int8_t*>(w.data);
  if (w.fmt == Fmt::S24_I8) {
    const int64_t nb = w.kp / 64;
    for (int64_t b = 0; b < nb; ++b)
      expand_s24_block(v + r * (w.kp / 2) + 32 * b, w.meta[r * nb + b], out + 64 * b);
    return;
  }
  const uint8_t* mrow = w.mask + r * (w.kp / 8);
  v += w.row_off[r];
  for (int64_t c = 0; c < w.kp / 8; c += 2) {
    const uint32_t m0 = mrow[c], m1 = mrow[c + 1];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 8 * c), expand16_i8(v, m0, m1));
    v += __builtin_popcount(m0 | m1 << 8);
  }
}

// The panel's rows decoded to floats (PanelRows::rows) into buf (8 x kp floats).
static void pack_rows(const PanelRows& W, float* Wt, float* buf) {
  pack_k_major(
      W, Wt, [&](int i, int64_t n) { return W.rows(8 * i, n, buf); },
      [](const float* p) { return _mm256_loadu_ps(p); });
}

// A bitmask or 2:4 panel's codes: expanded into buf (8 x kp bytes), then widened to floats.
static void pack_code_rows(const PanelRows& W, float* Wt, int8_t* buf) {
  pack_k_major(
      W, Wt,
      [&](int i, int64_t n) {
        for (int64_t j = 0; j < n; ++j) code_row(W.w, W.r0 + 8 * i + j, buf + j * W.w.kp);
        return static_cast<const int8_t*>(buf);
      },
      [](const int8_t* p) {
        return _mm256_cvtepi32_ps(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
      });
}

// Fmt::I8_R16's codes as floats, k-major (Wt[k][48]): a 16-row block holds each 4 columns as
// 16 rows x 4 bytes; a shuffle puts each column's 8 rows (of rows 0-7, then 8-15) in a qword,
// which is widened to 8 floats. Groups past the panel's rows are zero.
static void pack_r16_codes(const PanelRows& W, float* Wt) {
  const int64_t k = W.w.kp;
  const __m256i by_col = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                          0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int g = 0; g < kGroups; ++g) {
    float* out = Wt + 16 * g;
    if (16 * g >= W.nr) {
      for (int64_t p = 0; p < k; ++p) {
        _mm256_store_ps(out + p * kPanelRows, _mm256_setzero_ps());
        _mm256_store_ps(out + p * kPanelRows + 8, _mm256_setzero_ps());
      }
      continue;
    }
    const int8_t* blk = r16_block(W.w, (W.r0 + 16 * g) / kRowBlock16);
    for (int64_t p = 0; p < k; p += 4)
      for (int h = 0; h < 2; ++h) {  // rows 8h .. 8h + 7
        const __m256i v =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 * p + 32 * h));
        alignas(32) int64_t cols[4];
        _mm256_store_si256(reinterpret_cast<__m256i*>(cols),
                           _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v, by_col), order));
        for (int c = 0; c < 4; ++c)
          _mm256_store_ps(out + (p + c) * kPanelRows + 8 * h,
                          _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(cols[c]))));
      }
  }
}

using MicroFn = void (*)(const float*, const float*, int64_t, int64_t, float*, int64_t,
                         const __m256i*, bool);
template <bool kCodes>
static constexpr MicroFn kMicro[kTokens + 1] = {nullptr,  micro<1, kCodes>, micro<2, kCodes>,
                                                micro<3, kCodes>, micro<4, kCodes>,
                                                micro<5, kCodes>, micro<6, kCodes>};

template <bool kCodes>
static void panel(const PanelRows& W, const float* X, int64_t ldx, int64_t T, float* Y,
                  int64_t ldy, const float* xscale) {
  const int64_t k = W.w.kp, nr = W.nr;
  thread_local AlignedVector<float> packed, rows8;  // rows8: 8 decoded rows, or their codes
  if (packed.size() < size_t(kPanelRows * k)) packed.resize(size_t(kPanelRows * k));
  if (rows8.size() < size_t(8 * k)) rows8.resize(size_t(8 * k));
  float* Wt = packed.data();
  if (!kCodes) pack_rows(W, Wt, rows8.data());
  else if (W.w.fmt == Fmt::I8_R16) pack_r16_codes(W, Wt);
  else pack_code_rows(W, Wt, reinterpret_cast<int8_t*>(rows8.data()));
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
        kMicro<kCodes>[c](Wt + k0 * kPanelRows + 16 * g, X + t * ldx + k0, ldx, kb,
                  Y + t * ldy + 16 * g, ldy, rm.m + 2 * g, k0 > 0);
    }
  }
  if constexpr (kCodes) {  // the int32 dots -> y, as the GEMV scales them
    for (int i = 0; i < 2 * kGroups && 8 * i < nr; ++i) {
      const __m256 sc = _mm256_maskload_ps(W.w.scale + W.r0 + 8 * i, rm.m[i]);
      for (int64_t t = 0; t < T; ++t) {
        float* y = Y + t * ldy + 8 * i;
        const __m256i dot = _mm256_castps_si256(_mm256_maskload_ps(y, rm.m[i]));
        const __m256 s = _mm256_mul_ps(_mm256_set1_ps(xscale[t]), sc);
        _mm256_maskstore_ps(y, rm.m[i], _mm256_mul_ps(_mm256_cvtepi32_ps(dot), s));
      }
    }
  }
}

void panel_gemm(const PanelRows& W, const float* X, int64_t ldx, int64_t T, float* Y,
                int64_t ldy) {
  panel<false>(W, X, ldx, T, Y, ldy, nullptr);
}

void panel_gemm_codes(const PanelRows& W, const float* X, int64_t ldx, int64_t T, float* Y,
                      int64_t ldy, const float* xscale) {
  panel<true>(W, X, ldx, T, Y, ldy, xscale);
}

}  // namespace sl::avx2
