// The prompt-attention block driver both ISA kernels share (kernels/avx2/attention.cpp,
// kernels/avx512/attention.cpp; the contract of attend_block in ops.h): buf's layout, each row's
// query and output pointers, the keys transposed into Kt, the score tiles, the softmax per row over
// its own keys, the values as floats and the value tiles. Tiles, a type local to the including
// file (so each object file has its own instantiation), brings the registers:
//   kBlock: Kt is written in kBlock x kBlock blocks, transpose_keys(K, ld, n, hd, j, d, Kt, nk)
//     (keys j.. past n zero); widen(row, d, hd, out): kBlock values of a cache row as floats;
//   kScoreRows x kScoreKeys: score_tile<R>(qrows, Kt, nk, hd, j, scale, S, lds);
//   kValueRows: value_rows<R>(S, lds, V, ldv, keys, hd, inv, orows), all hd columns.
// Include only from those two files.
#pragma once

#include <algorithm>
#include <type_traits>

#include "ops.h"
#include "kernels/tiles.h"

namespace sl {

template <class Tiles, typename KV>
inline void attend_block_with(const float* q, int64_t ldq, int64_t nq, int64_t G, const KV* K,
                              const KV* V, int64_t n0, int64_t hd, float scale, float* buf,
                              float* out, int64_t ldo) {
  const int64_t n = n0 + nq - 1, nk = (n + 31) & ~int64_t(31), m = nq * G, ld = kv_row<KV>(hd);
  float* Kt = buf;            // (hd, nk): the keys transposed, zero past n
  float* Vf = Kt + hd * nk;   // (nk, hd) the values as floats (non-float caches)
  float* S = Vf + nk * hd;    // (m, nk) scores, then weights
  float* inv = S + m * nk;    // (m) 1 / the row's sum
  for (int64_t j = 0; j < nk; j += Tiles::kBlock)
    for (int64_t d = 0; d < hd; d += Tiles::kBlock)
      Tiles::transpose_keys(K, ld, n, hd, j, d, Kt, nk);
  // Row i = token i / G, head i % G.
  const float* qrows[kAttendBlockQueries * kAttendMaxGroup];
  float* orows[kAttendBlockQueries * kAttendMaxGroup];
  for (int64_t i = 0; i < m; ++i) {
    qrows[i] = q + (i / G) * ldq + (i % G) * hd;
    orows[i] = out + (i / G) * ldo + (i % G) * hd;
  }
  rows_in_tiles<Tiles::kScoreRows>(m, [&](auto rr, int64_t i0) {
    constexpr int R = decltype(rr)::value;
    const int64_t keys = n0 + (i0 + R - 1) / G;  // the tile's last row sees the most
    for (int64_t j = 0; j < keys; j += Tiles::kScoreKeys)
      Tiles::template score_tile<R>(qrows + i0, Kt, nk, hd, j, scale, S + i0 * nk, nk);
  });
  for (int64_t i = 0; i < m; ++i) {
    const int64_t L = n0 + i / G;
    float* row = S + i * nk;
    inv[i] = 1.f / avx2::exp_inplace(row, L).sum;
    std::fill(row + L, row + nk, 0.f);
  }
  const float* Vsrc;
  int64_t ldv;
  if constexpr (std::is_same_v<KV, float>) {
    Vsrc = V;
    ldv = ld;
  } else {
    for (int64_t j = 0; j < n; ++j)
      for (int64_t d = 0; d < hd; d += Tiles::kBlock)
        Tiles::widen(V + j * ld, d, hd, Vf + j * hd + d);
    Vsrc = Vf;
    ldv = hd;
  }
  rows_in_tiles<Tiles::kValueRows>(m, [&](auto rr, int64_t i0) {
    constexpr int R = decltype(rr)::value;
    const int64_t keys = n0 + (i0 + R - 1) / G;
    Tiles::template value_rows<R>(S + i0 * nk, nk, Vsrc, ldv, keys, hd, inv + i0, orows + i0);
  });
}

}  // namespace sl
