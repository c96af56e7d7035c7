// Int8 per-output-channel GEMV, AVX-512: W8A8 over the 16-row blocks of Fmt::I8_R16 (VNNI) and
// weight-only W8A16 (widened to fp32, gemv.h). Compiled with this folder's flags; only called
// when runtime/cpu.cpp found AVX512F/BW/VL/VNNI/VBMI/VBMI2.
#include "kernels/avx512/gemv.h"

namespace sl::avx512 {

// Dense W8A8 over the 16-row blocks of Fmt::I8_R16 (weight.h): per 4 columns one 64-byte load
// (16 rows x 4 weights) and one vpdpbusd per token with the token's 4 activations broadcast, so
// each token's zmm accumulates the 16 rows' dot products. With 8 tokens, hot in L2, this runs at
// vpdpbusd's peak of one per cycle; row by row with the add tree above it ran at about half.
// Software prefetch only for tiles of several tokens: a single token streams DRAM faster
// without it (see tiles.h).
namespace {
// One block (16 rows from row r, 16 * kp bytes; scale16: the rows' 16 scales, zero past r1)
// against tokens [t0, t0 + NT).
template <int NT>
inline void r16_block_tokens(const int8_t* blk, const float* scale16, int64_t kp, const Acts& a,
                             float* y, int64_t ldy, int64_t r, int64_t r1, int64_t t0) {
  const __m512i offset = _mm512_set1_epi8(char(0x80));
  const int8_t* xq = a.xq + t0 * kp;
  __m512i acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_si512();
  for (int64_t k = 0; k < kp; k += 4) {
    if constexpr (NT > 1) prefetch_ahead(blk + 16 * k);
    const __m512i wu = _mm512_xor_si512(_mm512_loadu_si512(blk + 16 * k), offset);
    for (int t = 0; t < NT; ++t) {
      int32_t x4;
      std::memcpy(&x4, xq + t * kp + k, 4);
      acc[t] = _mm512_dpbusd_epi32(acc[t], wu, _mm512_set1_epi32(x4));
    }
  }
  // y = float(dot - 128 * xsum) * (xscale * scale): the other kernels' float operations.
  const __mmask16 store = r1 - r >= kRowBlock16 ? 0xffff : (1u << (r1 - r)) - 1;
  const __m512 scale = _mm512_loadu_ps(scale16);
  for (int t = 0; t < NT; ++t) {
    const __m512i dot = _mm512_sub_epi32(acc[t], _mm512_set1_epi32(128 * a.xsum[t0 + t]));
    const __m512 s = _mm512_mul_ps(_mm512_set1_ps(a.xscale[t0 + t]), scale);
    _mm512_mask_storeu_ps(y + (t0 + t) * ldy + r, store,
                          _mm512_mul_ps(_mm512_cvtepi32_ps(dot), s));
  }
}
}  // namespace

void gemv_i8a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  for_rows_and_tiles<kMaxNT>(r0 / kRowBlock16, row_blocks16(r1), a.T, [&](auto nt, int64_t b,
                                                                          int64_t t0) {
    const int64_t r = b * kRowBlock16;
    r16_block_tokens<decltype(nt)::value>(r16_block(w, b), w.scale + r, w.kp, a, y, ldy, r, r1,
                                          t0);
  });
}

void gemv_i8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const int8_t* W = static_cast<const int8_t*>(w.data);
  widen_rows(w, a, y, ldy, r0, r1, [&](int64_t r) {
    return [q = W + r * w.kp](__m512* wf) mutable {
      prefetch_ahead(q);  // one cache line per step; faster at T == 1 as well (tiles.h)
      for (int i = 0; i < 4; ++i)
        wf[i] = widen16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * i)));
      q += 64;
    };
  });
}

}  // namespace sl::avx512
