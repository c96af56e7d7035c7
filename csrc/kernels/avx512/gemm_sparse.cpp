// Prefill GEMM of bitmask-sparse fp32 weights (Fmt::SP_F32), AVX-512F, multiplying only the
// kept weights: per kept weight w[r, k], up to 128 tokens' activations at column k (the chunk
// transposed, k-major: one vector per 16 tokens) are FMAd with w broadcast into row r's
// accumulators, so a 50%-sparse row costs half the FMAs of a dense one. The dense panel GEMM
// (kernels/avx512/gemm.cpp) multiplies every weight, zeros included, after decoding sparse panels
// to dense ones.
//
// Per kept weight: one broadcast and a load + FMA per 16 tokens. A block of kKBlock columns of
// the transposed activations (64 x 128 floats, 32 KB) is walked by kRows rows in turn, their
// accumulators saved between blocks in a (kRows x 128) buffer (32 KB; 16 and 128 rows were
// slower). Each output accumulates its kept weights in column order whatever T is (batch
// invariant). It beats the dense panel GEMM on the same weights from kSparseF32GemmMinTokens
// tokens (runtime/linear.cpp).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels.h"
#include "kernels/avx512/simd.h"

namespace sl::avx512 {

namespace {
constexpr int64_t kKBlock = 64;  // one mask word
constexpr int64_t kRows = 64;

// Rows [ra, rz) x one tile of M token vectors (xt: the tile's (kp, kSparseTile) activations).
template <int M>
void tile_rows(const Weight& w, const float* xt, int64_t ra, int64_t rz, float* part) {
  const int64_t kp = w.kp;
  const float* vals[kRows];
  for (int64_t i = 0; i < rz - ra; ++i)
    vals[i] = static_cast<const float*>(w.data) + w.row_off[ra + i];
  for (int64_t k0 = 0; k0 < kp; k0 += kKBlock) {
    const float* xb = xt + k0 * kSparseTile;
    for (int64_t i = 0; i < rz - ra; ++i) {
      float* p = part + i * kSparseTile;
      // Kept weights take turns in S accumulator sets, so that 8 or more FMA chains (4 cycles
      // each) are in flight from 4 token vectors on; the sets add up at the word's end. (S is
      // the same for every M: a token's sums must not depend on its tile's size.)
      constexpr int S = 2;
      __m512 acc[S][M];
      for (int j = 0; j < M; ++j) {
        acc[0][j] = k0 ? _mm512_load_ps(p + 16 * j) : _mm512_setzero_ps();
        for (int s = 1; s < S; ++s) acc[s][j] = _mm512_setzero_ps();
      }
      uint64_t bits;
      std::memcpy(&bits, w.mask + (ra + i) * (kp / 8) + k0 / 8, 8);
      const float* v = vals[i];
      const auto fma = [&](__m512* a) __attribute__((always_inline)) {
        const __m512 wv = _mm512_set1_ps(*v++);
        const float* x = xb + __builtin_ctzll(bits) * kSparseTile;
        bits &= bits - 1;
        for (int j = 0; j < M; ++j) a[j] = _mm512_fmadd_ps(wv, _mm512_load_ps(x + 16 * j), a[j]);
      };
      for (int n = __builtin_popcountll(bits); n >= S; n -= S)
        for (int s = 0; s < S; ++s) fma(acc[s]);
      while (bits) fma(acc[0]);
      vals[i] = v;
      for (int s = 1; s < S; ++s)
        for (int j = 0; j < M; ++j) acc[0][j] = _mm512_add_ps(acc[0][j], acc[s][j]);
      for (int j = 0; j < M; ++j) _mm512_store_ps(p + 16 * j, acc[0][j]);
    }
  }
}

template <int M = kSparseTile / 16>
void tile_rows_for(int m, const Weight& w, const float* xt, int64_t ra, int64_t rz, float* part) {
  if constexpr (M > 1)
    if (m < M) return tile_rows_for<M - 1>(m, w, xt, ra, rz, part);
  tile_rows<M>(w, xt, ra, rz, part);
}
}  // namespace

// Tokens per tile: T split into near-equal tiles of at most kSparseTile, whole vectors (a
// remainder of a few tokens would make a tile of few vectors, which runs at a fraction of the
// speed).
static int64_t tile_tokens(int64_t T) {
  const int64_t n = (T + kSparseTile - 1) / kSparseTile;
  return ((T + n - 1) / n + 15) / 16 * 16;
}

void transpose_tokens(const float* x, int64_t T, int64_t kp, float* xt) {
  const int64_t tt = tile_tokens(T);
  for (int64_t t0 = 0; t0 < T; t0 += tt) {
    float* tile = xt + t0 / tt * kp * kSparseTile;  // (kp, kSparseTile), lanes past T zero
    for (int64_t ts = t0; ts < t0 + tt; ts += 16)
      for (int64_t k = 0; k < kp; k += 16) {
        __m512 r[16];
        for (int j = 0; j < 16; ++j)
          r[j] = ts + j < T ? _mm512_loadu_ps(x + (ts + j) * kp + k) : _mm512_setzero_ps();
        transpose16(r);  // r[j]: column k + j of the 16 tokens
        for (int j = 0; j < 16; ++j) _mm512_store_ps(tile + (k + j) * kSparseTile + (ts - t0), r[j]);
      }
  }
}

void sp_f32_gemm(const Weight& w, const float* xt, int64_t T, float* y, int64_t ldy, int64_t r0,
                 int64_t r1) {
  alignas(64) float part[kRows * kSparseTile];
  const int64_t tt = tile_tokens(T);
  for (int64_t t0 = 0; t0 < T; t0 += tt) {
    const int64_t nt = std::min(tt, T - t0);
    const int m = int((nt + 15) / 16);
    for (int64_t ra = r0; ra < r1; ra += kRows) {
      const int64_t rz = std::min(r1, ra + kRows);
      tile_rows_for(m, w, xt + t0 / tt * w.kp * kSparseTile, ra, rz, part);
      // part (rows, tokens) -> y (tokens, rows), 16 x 16 at a time
      for (int64_t i = 0; i < rz - ra; i += 16)
        for (int64_t j = 0; j < nt; j += 16) {
          __m512 r[16];
          for (int a = 0; a < 16; ++a)
            r[a] = ra + i + a < rz ? _mm512_load_ps(part + (i + a) * kSparseTile + j)
                                   : _mm512_setzero_ps();
          transpose16(r);  // r[b]: token j + b of the 16 rows
          const int64_t n = std::min<int64_t>(16, rz - ra - i);
          const __mmask16 store = n == 16 ? 0xffff : __mmask16((1u << n) - 1);
          for (int b = 0; b < 16 && j + b < nt; ++b)
            _mm512_mask_storeu_ps(y + (t0 + j + b) * ldy + ra + i, store, r[b]);
        }
    }
  }
}

}  // namespace sl::avx512
