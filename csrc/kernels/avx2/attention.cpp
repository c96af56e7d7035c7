// Prompt attention with AVX2, the AVX-512 kernel's form (kernels/avx512/attention.cpp; both are
// this file's register tiles for the driver in attention_block.h): a block of up to
// kAttendBlockQueries consecutive tokens of one sequence, with the G query heads that share a KV
// head, against that head's keys as two small GEMMs, where the per-token kernel
// (kernels/avx2/ops.cpp attend) loads every key and value once per token and sums each score
// horizontally:
//   S = scale * Q K^T: the keys transposed (8 x 8 register blocks, converted from the cache's
//   type) into Kt (hd, keys); 6 rows x 16 keys of scores accumulate as outer products, a
//   broadcast query value times two key vectors (12 accumulators of the 16 ymm);
//   softmax per row over its own keys (token t of the block sees keys 0..n0 + t - 1), the rest
//   of its scores zeroed;
//   O = S V: 6 rows x 16 columns accumulate over the keys, a broadcast score times two value
//   vectors (8 columns at the end of a head width that is not a multiple of 16), divided by
//   the row's sum at the end.
// Each row's arithmetic is fixed by its own keys (zeroed scores add exact zeros), so a token's
// result does not depend on the block or the thread it falls in; prompt chunks only
// (AttnShape::prompt). The k loops are do-whiles: as for loops GCC 12 kept the accumulators in
// memory (kernels/avx2/gemm.cpp).
#include <immintrin.h>

#include <type_traits>

#include "kernels/attention_block.h"
#include "kernels/avx2/simd.h"

namespace sl::avx2 {

namespace {

// 8 values of a cache row from column d, as floats (int8 rows: times their scale).
template <typename KV>
inline __m256 load8(const KV* row, int64_t d, int64_t hd) {
  if constexpr (std::is_same_v<KV, float>) {
    return _mm256_loadu_ps(row + d);
  } else if constexpr (std::is_same_v<KV, uint16_t>) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + d)));
  } else {
    const __m256 v = _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + d))));
    return _mm256_mul_ps(v, _mm256_set1_ps(kv_scale(row, hd)));
  }
}

// O rows [0, R) x columns [c, c + 8 NV) = sum over keys j < n (>= 1) of S[r][j] V[j][c..].
template <int R, int NV>
inline void value_tile(const float* S, int64_t lds, const float* V, int64_t ldv, int64_t n,
                       int64_t c, const float* inv, float* const* orows) {
  __m256 acc[NV][R];
  for (int v = 0; v < NV; ++v)
    for (int r = 0; r < R; ++r) acc[v][r] = _mm256_setzero_ps();
  int64_t j = 0;
  do {
    __m256 vv[NV];
    for (int v = 0; v < NV; ++v) vv[v] = _mm256_loadu_ps(V + j * ldv + c + 8 * v);
    for (int r = 0; r < R; ++r) {
      const __m256 s = _mm256_broadcast_ss(S + r * lds + j);
      for (int v = 0; v < NV; ++v) acc[v][r] = _mm256_fmadd_ps(s, vv[v], acc[v][r]);
    }
  } while (++j < n);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v)
      _mm256_storeu_ps(orows[r] + c + 8 * v, _mm256_mul_ps(acc[v][r], _mm256_set1_ps(inv[r])));
}

// The registers of the shared driver (attention_block.h).
struct Tiles {
  static constexpr int kBlock = 8, kScoreRows = 6, kScoreKeys = 16, kValueRows = 6;
  template <typename KV>
  static void transpose_keys(const KV* K, int64_t ld, int64_t n, int64_t hd, int64_t j,
                             int64_t d, float* Kt, int64_t nk) {
    __m256 r[8];
    for (int i = 0; i < 8; ++i)
      r[i] = j + i < n ? load8(K + (j + i) * ld, d, hd) : _mm256_setzero_ps();
    transpose8(r);
    for (int i = 0; i < 8; ++i) _mm256_store_ps(Kt + (d + i) * nk + j, r[i]);
  }
  template <typename KV>
  static void widen(const KV* row, int64_t d, int64_t hd, float* out) {
    _mm256_storeu_ps(out, load8(row, d, hd));
  }
  // S rows [0, R) x keys [j, j + 16): acc[r] += q_r[d] * Kt[d][j..], for d < hd (>= 8).
  template <int R>
  static void score_tile(const float* const* qrows, const float* Kt, int64_t nk, int64_t hd,
                         int64_t j, float scale, float* S, int64_t lds) {
    __m256 a0[R], a1[R];
    for (int r = 0; r < R; ++r) a0[r] = a1[r] = _mm256_setzero_ps();
    int64_t d = 0;
    do {
      const __m256 k0 = _mm256_load_ps(Kt + d * nk + j), k1 = _mm256_load_ps(Kt + d * nk + j + 8);
      for (int r = 0; r < R; ++r) {
        const __m256 q = _mm256_broadcast_ss(qrows[r] + d);
        a0[r] = _mm256_fmadd_ps(q, k0, a0[r]);
        a1[r] = _mm256_fmadd_ps(q, k1, a1[r]);
      }
    } while (++d < hd);
    const __m256 sv = _mm256_set1_ps(scale);
    for (int r = 0; r < R; ++r) {
      _mm256_store_ps(S + r * lds + j, _mm256_mul_ps(a0[r], sv));
      _mm256_store_ps(S + r * lds + j + 8, _mm256_mul_ps(a1[r], sv));
    }
  }
  // Columns in steps of 16 (hd % 16: 8 last).
  template <int R>
  static void value_rows(const float* S, int64_t lds, const float* V, int64_t ldv, int64_t keys,
                         int64_t hd, const float* inv, float* const* orows) {
    int64_t c = 0;
    for (; c + 16 <= hd; c += 16) value_tile<R, 2>(S, lds, V, ldv, keys, c, inv, orows);
    if (c < hd) value_tile<R, 1>(S, lds, V, ldv, keys, c, inv, orows);
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

}  // namespace sl::avx2
