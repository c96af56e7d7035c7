// Prompt attention with AVX-512 (this file's register tiles for the driver in
// attention_block.h): a block of up to kAttendBlockQueries consecutive tokens of one sequence,
// with the G query heads that share a KV head, against that head's keys as two small GEMMs.
// The per-token kernel (kernels/avx2/ops.cpp attend) loads every key and value once per token; here
// a block's m = tokens x G query rows share them:
//   S = scale * Q K^T: the keys are first transposed (16 x 16 register blocks, converted from
//   the cache's type) into Kt (hd, keys), so 12 rows x 32 keys of scores accumulate as outer
//   products, a broadcast query value times two key vectors;
//   softmax per row over its own keys (token t of the block sees keys 0..n0 + t - 1), the
//   rest of its scores zeroed;
//   O = S V: 6 rows x 64 columns of outputs accumulate over the keys, a broadcast score times
//   four value vectors, divided by the row's sum at the end.
// Each row's arithmetic is fixed by its own keys (zeroed scores add exact zeros), so a token's
// result does not depend on the block or the thread it falls in. It is not the per-token
// kernel's (kernels/avx2/ops.cpp attend), so only prompt chunks take it (AttnShape::prompt), where
// its register tiles reuse each loaded key and value across 6 queries.
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/attention_block.h"
#include "kernels/codegen.h"
#include "kernels/avx512/simd.h"

namespace sl::avx512 {

namespace {

// 16 values of a cache row from column d, as floats (int8 rows: times their scale).
template <typename KV>
inline __m512 load16(const KV* row, int64_t d, int64_t hd) {
  if constexpr (std::is_same_v<KV, float>) {
    return _mm512_loadu_ps(row + d);
  } else if constexpr (std::is_same_v<KV, uint16_t>) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + d)));
  } else {
    const __m512 v = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + d))));
    return _mm512_mul_ps(v, _mm512_set1_ps(kv_scale(row, hd)));
  }
}

// O rows [i0, i0 + R) x columns [c, c + 64) = sum over keys j < n of S[r][j] V[j][c..].
template <int R, typename VT>
inline void value_tile(const float* S, int64_t lds, const VT* V, int64_t ldv, int64_t n,
                       int64_t c, int64_t hd, const float* inv, float* const* orows) {
  __m512 acc[R][4];
  __mmask16 live[4];  // the vectors within hd (a multiple of 16)
  SL_UNROLL for (int v = 0; v < 4; ++v) live[v] = c + 16 * v < hd ? 0xffff : 0;
  SL_UNROLL for (int r = 0; r < R; ++r)
    SL_UNROLL for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    __m512 vv[4];
    SL_UNROLL for (int v = 0; v < 4; ++v)
      vv[v] = _mm512_maskz_loadu_ps(live[v], V + j * ldv + c + 16 * v);
    SL_UNROLL for (int r = 0; r < R; ++r) {
      const __m512 s = _mm512_set1_ps(S[r * lds + j]);
      SL_UNROLL for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_fmadd_ps(s, vv[v], acc[r][v]);
    }
  }
  SL_UNROLL for (int r = 0; r < R; ++r)
    SL_UNROLL for (int v = 0; v < 4; ++v)
      if (c + 16 * v < hd)
        _mm512_storeu_ps(orows[r] + c + 16 * v, _mm512_mul_ps(acc[r][v], _mm512_set1_ps(inv[r])));
}

// The registers of the shared driver (attention_block.h).
struct Tiles {
  static constexpr int kBlock = 16, kScoreRows = 12, kScoreKeys = 32, kValueRows = 6;
  template <typename KV>
  static void transpose_keys(const KV* K, int64_t ld, int64_t n, int64_t hd, int64_t j,
                             int64_t d, float* Kt, int64_t nk) {  // rows past n zero
    __m512 r[16];
    for (int i = 0; i < 16; ++i)
      r[i] = j + i < n ? load16(K + (j + i) * ld, d, hd) : _mm512_setzero_ps();
    transpose16(r);
    for (int i = 0; i < 16; ++i) _mm512_store_ps(Kt + (d + i) * nk + j, r[i]);
  }
  template <typename KV>
  static void widen(const KV* row, int64_t d, int64_t hd, float* out) {
    _mm512_storeu_ps(out, load16(row, d, hd));
  }
  // S rows [i0, i0 + R) x keys [j, j + 32): acc[r][c] += q_r[d] * Kt[d][j + 16c].
  template <int R>
  static void score_tile(const float* const* qrows, const float* Kt, int64_t nk, int64_t hd,
                         int64_t j, float scale, float* S, int64_t lds) {
    __m512 acc[R][2];
    SL_UNROLL for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t d = 0; d < hd; ++d) {
      const __m512 k0 = _mm512_load_ps(Kt + d * nk + j), k1 = _mm512_load_ps(Kt + d * nk + j + 16);
      SL_UNROLL for (int r = 0; r < R; ++r) {
        const __m512 q = _mm512_set1_ps(qrows[r][d]);
        acc[r][0] = _mm512_fmadd_ps(q, k0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(q, k1, acc[r][1]);
      }
    }
    const __m512 sv = _mm512_set1_ps(scale);
    SL_UNROLL for (int r = 0; r < R; ++r) {
      _mm512_store_ps(S + r * lds + j, _mm512_mul_ps(acc[r][0], sv));
      _mm512_store_ps(S + r * lds + j + 16, _mm512_mul_ps(acc[r][1], sv));
    }
  }
  template <int R>
  static void value_rows(const float* S, int64_t lds, const float* V, int64_t ldv, int64_t keys,
                         int64_t hd, const float* inv, float* const* orows) {
    for (int64_t c = 0; c < hd; c += 64) value_tile<R>(S, lds, V, ldv, keys, c, hd, inv, orows);
  }
};

}  // namespace

template <typename KV>
void attend_block(const float* q, int64_t ldq, int64_t nq, int64_t G, const KV* K, const KV* V,
                  int64_t n0, int64_t hd, float scale, float* buf, float* out, int64_t ldo) {
  attend_block_with<Tiles>(q, ldq, nq, G, K, V, n0, hd, scale, buf, out, ldo);
}

template void attend_block<float>(const float*, int64_t, int64_t, int64_t, const float*,
                                  const float*, int64_t, int64_t, float, float*, float*, int64_t);
template void attend_block<uint16_t>(const float*, int64_t, int64_t, int64_t, const uint16_t*,
                                     const uint16_t*, int64_t, int64_t, float, float*, float*,
                                     int64_t);
template void attend_block<int8_t>(const float*, int64_t, int64_t, int64_t, const int8_t*,
                                   const int8_t*, int64_t, int64_t, float, float*, float*,
                                   int64_t);

}  // namespace sl::avx512
