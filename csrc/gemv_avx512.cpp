// W8A8 GEMV with AVX-512 VNNI, and its bitmask-sparse twin with VBMI2 (compiled with those
// flags; only called when cpu.cpp found AVX512F/BW/VL/VNNI/VBMI2).
//
// vpdpbusd multiplies 64 unsigned by 64 signed bytes and adds each group of 4 products into 16
// int32 lanes: one instruction per 64 weights per token, against 8 for the AVX2 sign/maddubs
// chain, so batched decode, verification and prefill stop being compute-bound. The weights are
// the unsigned operand, offset by 128 (w ^ 0x80 == w + 128 as a byte, 1..255: -128 is never
// stored), and the offset's share, 128 * sum(x), is subtracted once per token (Acts::xsum):
// the int32 dot product is exact, bitwise the value of the AVX2 and scalar kernels.
//
// The bitmask format expands a row's packed values to 64 dense columns with one vpexpandb per
// 64-bit mask word (AVX2 needs ~10 instructions per 16 columns, see gemv_sparse_avx2.cpp):
// dropped columns get the offset byte, 0x80, i.e. weight 0.
#include <immintrin.h>

#include <cstring>

#include "common.h"
#include "tiles.h"

namespace sl::avx512 {

namespace {
// Tokens per tile: each has one zmm accumulator, and a weight vector is loaded (or expanded)
// once per tile. 16 of the 32 zmm registers; T <= 16 streams a row once.
constexpr int kMaxNT = 16;

// The 16-lane sums of 8 accumulators, as 8 int32 lanes: a transposing add tree of ~25
// instructions where 8 separate reductions took ~70. With 576-column rows a token's dot
// product is only 9 vpdpbusd, so the reductions were a third of a batched row's work.
inline __m256i reduce8(const __m512i* acc) {
  __m256i h[8];
  for (int i = 0; i < 8; ++i)
    h[i] = _mm256_add_epi32(_mm512_castsi512_si256(acc[i]), _mm512_extracti64x4_epi64(acc[i], 1));
  const __m256i s01 = _mm256_hadd_epi32(h[0], h[1]), s23 = _mm256_hadd_epi32(h[2], h[3]);
  const __m256i s45 = _mm256_hadd_epi32(h[4], h[5]), s67 = _mm256_hadd_epi32(h[6], h[7]);
  // s0123 = [sums of lanes 0..3 of h0 h1 h2 h3 | sums of lanes 4..7 of h0 h1 h2 h3]
  const __m256i s0123 = _mm256_hadd_epi32(s01, s23), s4567 = _mm256_hadd_epi32(s45, s67);
  return _mm256_add_epi32(_mm256_permute2x128_si256(s0123, s4567, 0x20),
                          _mm256_permute2x128_si256(s0123, s4567, 0x31));
}

template <class Load64>
inline void vnni_rows(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0,
                      int64_t r1, Load64 load64) {
  const int64_t kp = w.kp;
  for_rows_and_tiles<kMaxNT>(r0, r1, a.T, [&](auto nt, int64_t r, int64_t t0) {
    constexpr int NT = decltype(nt)::value;
    const __m512i offset = _mm512_set1_epi8(char(0x80));
    auto next = load64(r);  // yields offset weights for the next 64 columns of row r
    const int8_t* xq = a.xq + t0 * kp;
    __m512i acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_si512();
    for (int64_t k = 0; k < kp; k += 64) {
      const __m512i wu = next(offset);
      for (int t = 0; t < NT; ++t)
        acc[t] = _mm512_dpbusd_epi32(acc[t], wu, _mm512_loadu_si512(xq + t * kp + k));
    }
    // y = float(dot - 128 * xsum) * (xscale * scale): the same float operations either way.
    int t = 0;
    for (; t + 8 <= NT; t += 8) {
      const __m256i xsum = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.xsum + t0 + t));
      const __m256i dot = _mm256_sub_epi32(reduce8(acc + t), _mm256_slli_epi32(xsum, 7));
      const __m256 ys = _mm256_mul_ps(_mm256_cvtepi32_ps(dot),
                                      _mm256_mul_ps(_mm256_loadu_ps(a.xscale + t0 + t),
                                                    _mm256_set1_ps(w.scale[r])));
      alignas(32) float out[8];
      _mm256_store_ps(out, ys);
      for (int i = 0; i < 8; ++i) y[(t0 + t + i) * ldy + r] = out[i];
    }
    for (; t < NT; ++t) {
      const int32_t dot = _mm512_reduce_add_epi32(acc[t]) - 128 * a.xsum[t0 + t];
      y[(t0 + t) * ldy + r] = float(dot) * (a.xscale[t0 + t] * w.scale[r]);
    }
  });
}
}  // namespace

void gemv_i8a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const int8_t* W = static_cast<const int8_t*>(w.data);
  vnni_rows(w, a, y, ldy, r0, r1, [&](int64_t r) {
    return [p = W + r * w.kp](__m512i offset) mutable {
      prefetch_ahead(p);
      const __m512i v = _mm512_xor_si512(_mm512_loadu_si512(p), offset);
      p += 64;
      return v;
    };
  });
}

// Reads up to 63 bytes past a row's last value: the packed values end with 64 bytes of padding
// (formats._VALUE_PAD).
void gemv_sp_i8a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const int8_t* V = static_cast<const int8_t*>(w.data);
  vnni_rows(w, a, y, ldy, r0, r1, [&](int64_t r) {
    return [v = V + w.row_off[r], m = w.mask + r * (w.kp / 8)](__m512i offset) mutable {
      prefetch_ahead(v);
      prefetch_ahead(m);
      uint64_t bits;
      std::memcpy(&bits, m, 8);
      const __m512i e = _mm512_mask_expand_epi8(
          offset, bits, _mm512_xor_si512(_mm512_loadu_si512(v), offset));
      v += __builtin_popcountll(bits);
      m += 8;
      return e;
    };
  });
}

}  // namespace sl::avx512
