// W8A8 GEMV with AVX-512 VNNI, its bitmask-sparse twin with VBMI2 and 2:4 twin with VBMI, and
// bitmask-sparse int4 with VBMI (compiled with those flags; only called when cpu.cpp found
// AVX512F/BW/VL/VNNI/VBMI/VBMI2).
//
// vpdpbusd multiplies 64 unsigned by 64 signed bytes and adds each group of 4 products into 16
// int32 lanes: one instruction per 64 weights per token, against 8 for the AVX2 sign/maddubs
// chain, so batched decode, verification and prefill stop being compute-bound. The weights are
// the unsigned operand, offset by 128 (w ^ 0x80 == w + 128 as a byte, 0..255: -128 is 0),
// and the offset's share, 128 * sum(x), is subtracted once per token (Acts::xsum):
// the int32 dot product is exact, bitwise the value of the AVX2 and scalar kernels.
//
// The bitmask format expands a row's packed values to 64 dense columns with one vpexpandb per
// 64-bit mask word (AVX2 needs ~10 instructions per 16 columns, see gemv_sparse_avx2.cpp):
// dropped columns get the offset byte, 0x80, i.e. weight 0.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "common.h"
#include "simd_avx512.h"
#include "tiles.h"

namespace sl::avx512 {

namespace {
// Tokens per tile: each has one zmm accumulator, and a weight vector is loaded (or expanded)
// once per tile. 16-token tiles were slower than two 8-token passes over a row (which the
// second reads from L1) for the bitmask kernel; the dense 16-row-block kernel ran the same.
constexpr int kMaxNT = 8;

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

// The end of a group of the W4A8 kernels' int32 dots at columns [k, k + 64) (of two groups when
// G == 32: lanes 0-7 and 8-15 hold different ones): acc[t] += float(dot[t]) * the groups'
// scales, and dot[t] starts again.
template <int G, int NT>
inline void scale_group_dots(const float* sc, int64_t k, __m512i* dot, __m512* acc) {
  const __m512 s = G > 32 ? _mm512_set1_ps(sc[k / G])
                          : _mm512_castpd_ps(_mm512_insertf64x4(
                                _mm512_castps_pd(_mm512_set1_ps(sc[k / 32])),
                                _mm256_castps_pd(_mm256_set1_ps(sc[k / 32 + 1])), 1));
  for (int t = 0; t < NT; ++t) {
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[t]), s, acc[t]);
    dot[t] = _mm512_setzero_si512();
  }
}

// Row by row, for the bitmask kernel: load64(r) yields the offset weights of row r's next 64
// columns, one vpdpbusd per token multiplies them, and reduce8 sums each token's 16 lanes.
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

// Dense W8A8 over the 16-row blocks of Fmt::I8_R16 (common.h): per 4 columns one 64-byte load
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


namespace {
// spread[c]: vpermb indices putting byte 16c + i of a 64-byte vector in the low byte of dword
// i, the only bits vpermps reads of an index (the other bytes are don't-cares).
struct Spread {
  alignas(64) uint8_t idx[4][64] = {};
  constexpr Spread() {
    for (int c = 0; c < 4; ++c)
      for (int j = 0; j < 64; ++j) idx[c][j] = uint8_t(16 * c + j / 4);
  }
};
constexpr Spread kSpread{};
constexpr int kMaxNT4 = 8;  // tokens per tile of the int4 W4A8 kernels (one accumulator each)
// ... of the int4 W4A16 ones: 4 accumulators per token, 4 weight vectors (+ 2 tables, dense)
constexpr int kMaxNTI4 = 5;

}  // namespace

// Bitmask sparse int4 with fp32 activations (W4A16). Per 64-column mask word: the word's
// nibbles are widened to bytes in stream order, each in its byte's high half
// (word_nibbles << 4), a vpexpandb moves them to their columns (dropped columns get 0), and each 16-column chunk's
// bytes go to the top bytes of 16 dwords with one zero-masking vpermb: a dword is then the
// two's complement nibble q times 2^28, exactly, and one conversion and one multiply by the
// group's scale (broadcast from memory) make it the weight times 2^28; the row's sum is scaled
// back by 2^-28 at the end (exact: a power of two). One shuffle per 16 columns and no
// per-group shuffles: a 16-entry vpermps table per group (scale folded in), indexed through a
// vpermb, took 2 per chunk and 2 broadcasts per group, and shuffles bound the kernel at group
// 32 (at group 128, whose tables are rebuilt 4x less often, the two are close).
// Reads up to 32 bytes past a row's last value (the values end with 64 bytes of padding).
namespace {
template <int G>
void sp_i4_rows(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const uint8_t* V = static_cast<const uint8_t*>(w.data);
  const int64_t kp = w.kp, kw = words_end(w), ng = kp / G;
  const auto row = [&](auto nt, int64_t r, int64_t t0) __attribute__((always_inline)) {
    constexpr int NT = decltype(nt)::value;
    const uint8_t* m = w.mask + r * (kp / 8);
    const uint8_t* vals = V + w.row_off[r];
    const float* sc = w.scale + r * ng;
    const float* x = a.x + t0 * kp;
    __m512 acc[NT][4];  // one per 16-column chunk (one chain of 4 FMAs per word: 4x the latency)
    for (int t = 0; t < NT; ++t)
      for (int c = 0; c < 4; ++c) acc[t][c] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kw; k += 64) {
      uint64_t bits;
      std::memcpy(&bits, m + k / 8, 8);
      const __m512i e =
          _mm512_maskz_expand_epi8(bits, _mm512_slli_epi16(word_nibbles(vals), 4));
      vals += sp_i4_word_bytes(__builtin_popcountll(bits));
      for (int c = 0; c < 4; ++c) {
        const int64_t col = k + 16 * c;
        const __m512i q = _mm512_maskz_permutexvar_epi8(0x8888888888888888ull,
                                                        _mm512_load_si512(kSpread.idx[c]), e);
        const __m512 wf = _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(sc[col / G]));
        for (int t = 0; t < NT; ++t)
          acc[t][c] = _mm512_fmadd_ps(wf, _mm512_loadu_ps(x + t * kp + col), acc[t][c]);
      }
    }
    for (int t = 0; t < NT; ++t)
      y[(t0 + t) * ldy + r] = reduce_add4(acc[t]) * 0x1p-28f;
  };
  for_rows_and_tiles<kMaxNTI4>(r0, r1, a.T, row);
}
}  // namespace

void gemv_sp_i4(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  with_group(w.group, [&](auto g) { sp_i4_rows<decltype(g)::value>(w, a, y, ldy, r0, r1); });
}


// Dense int4 with fp32 activations (W4A16). A group's 16 possible weights, (q - z) * s, are a
// 16-entry vpermps table built once per group, and the nibbles index it straight from the bytes: a
// 16-byte block's bytes zero-extended to dwords hold its low nibbles (columns 0..15) in their low 4
// bits, the only bits vpermps reads of an index, and the same dwords shifted right by 4 its high
// nibbles (columns 16..31). Per 32 columns: one widening, one shift, two vpermps and one FMA per
// token, against ~20 instructions in the AVX2 kernel's widen-convert-FMA chain, which bounds that
// below the DRAM stream. The group's scale and zero point live in the table, so no group sums.
namespace {

template <bool Asym, int G>
void i4_rows(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const uint8_t* W = static_cast<const uint8_t*>(w.data);
  const int64_t kp = w.kp, ng = kp / G;
  const auto row = [&](auto nt, int64_t r, int64_t t0) __attribute__((always_inline)) {
    constexpr int NT = decltype(nt)::value;
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const uint8_t* q = W + r * (kp / 2);
    const float* sc = w.scale + r * ng;
    const uint8_t* zp = Asym ? w.zero + r * ng : nullptr;
    const float* x = a.x + t0 * kp;
    const auto table = [&](int64_t g) {  // (q - z) * s for q = 0..15
      const __m512 z = _mm512_set1_ps(Asym ? float(zp[g]) : 8.f);
      return _mm512_mul_ps(_mm512_sub_ps(iota, z), _mm512_set1_ps(sc[g]));
    };
    __m512 acc[NT][4];
    for (int t = 0; t < NT; ++t)
      for (int i = 0; i < 4; ++i) acc[t][i] = _mm512_setzero_ps();
    __m512 tab0 = _mm512_setzero_ps(), tab1 = tab0;
    for (int64_t k = 0; k < kp; k += 64) {
      if ((k & 127) == 0) prefetch_ahead(q + k / 2);
      if constexpr (G == 32) {
        tab0 = table(k / 32);
        tab1 = table(k / 32 + 1);
      } else if (k % G == 0) {
        tab0 = tab1 = table(k / G);
      }
      const __m512i b0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(
          reinterpret_cast<const __m128i*>(q + k / 2)));
      const __m512i b1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(
          reinterpret_cast<const __m128i*>(q + k / 2 + 16)));
      const __m512 wf[4] = {_mm512_permutexvar_ps(b0, tab0),
                            _mm512_permutexvar_ps(_mm512_srli_epi32(b0, 4), tab0),
                            _mm512_permutexvar_ps(b1, tab1),
                            _mm512_permutexvar_ps(_mm512_srli_epi32(b1, 4), tab1)};
      for (int t = 0; t < NT; ++t)
        for (int i = 0; i < 4; ++i)
          acc[t][i] = _mm512_fmadd_ps(wf[i], _mm512_loadu_ps(x + t * kp + k + 16 * i), acc[t][i]);
    }
    for (int t = 0; t < NT; ++t)
      y[(t0 + t) * ldy + r] = reduce_add4(acc[t]);
  };
  for_rows_and_tiles<kMaxNTI4>(r0, r1, a.T, row);
}

}  // namespace

void gemv_i4(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  with_group(w.group, [&](auto g) {  // group size and zero points as compile-time constants
    constexpr int G = decltype(g)::value;
    w.asym ? i4_rows<true, G>(w, a, y, ldy, r0, r1) : i4_rows<false, G>(w, a, y, ldy, r0, r1);
  });
}


// Dense int4 with int8 activations (W4A8), VNNI. Two 16-byte blocks (64 columns) become 64
// unsigned bytes in column order (i4_columns64, four instructions); vpdpbusd adds each token's
// 4-column products into 16 int32 lanes, exact over a group, which are converted and scaled
// at the group's end (per 64 columns when G == 32: lanes 0-7 and 8-15 are different groups).
// The zero points' share, sum_g s_g z_g (group sum of xq), is subtracted once per row and
// token (Acts::gsum).
namespace {
template <bool Asym, int G>
void i4a8_rows(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const uint8_t* W = static_cast<const uint8_t*>(w.data);
  const int64_t kp = w.kp, ng = kp / G;
  const auto row = [&](auto nt, int64_t r, int64_t t0) __attribute__((always_inline)) {
    constexpr int NT = decltype(nt)::value;
    const uint8_t* q = W + r * (kp / 2);
    const float* sc = w.scale + r * ng;
    const int8_t* xq = a.xq + t0 * kp;
    __m512 acc[NT];
    __m512i dot[NT];
    for (int t = 0; t < NT; ++t) {
      acc[t] = _mm512_setzero_ps();
      dot[t] = _mm512_setzero_si512();
    }
    for (int64_t k = 0; k < kp; k += 64) {
      if ((k & 127) == 0) prefetch_ahead(q + k / 2);
      const __m512i u = i4_columns64(q + k / 2);
      for (int t = 0; t < NT; ++t)
        dot[t] = _mm512_dpbusd_epi32(dot[t], u, _mm512_loadu_si512(xq + t * kp + k));
      if (G == 32 || (k + 64) % G == 0) scale_group_dots<G, NT>(sc, k, dot, acc);
    }
    const uint8_t* zp = Asym ? w.zero + r * ng : nullptr;
    for (int t = 0; t < NT; ++t) {
      const float* gs = a.gsum + (t0 + t) * ng;
      __m512 zero_term = _mm512_setzero_ps();  // sum_g s_g z_g gsum_g, 16 groups at a time
      for (int64_t g = 0; g < ng; g += 16) {
        const __mmask16 m = ng - g >= 16 ? 0xffff : (1u << (ng - g)) - 1;
        const __m512 z = Asym ? _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                                    _mm_maskz_loadu_epi8(m, zp + g)))
                              : _mm512_set1_ps(8.f);
        zero_term = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, sc + g), z),
                                    _mm512_maskz_loadu_ps(m, gs + g), zero_term);
      }
      y[(t0 + t) * ldy + r] =
          (_mm512_reduce_add_ps(acc[t]) - _mm512_reduce_add_ps(zero_term)) * a.xscale[t0 + t];
    }
  };
  for_rows_and_tiles<kMaxNT4>(r0, r1, a.T, row);
}

}  // namespace

void gemv_i4a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  with_group(w.group, [&](auto g) {
    constexpr int G = decltype(g)::value;
    w.asym ? i4a8_rows<true, G>(w, a, y, ldy, r0, r1) : i4a8_rows<false, G>(w, a, y, ldy, r0, r1);
  });
}


// Bitmask sparse int4 with int8 activations (W4A8), VNNI. A word's nibbles are widened and
// expanded as in gemv_sp_i4, as unsigned offset values (q + 8; dropped columns get 8, i.e. 0);
// vpdpbusd adds each token's products into 16 int32 lanes, exact over a whole group, which is
// converted to fp32 and scaled at the group's end (per word when G == 32: lanes 0-7 and 8-15
// hold different groups). The offset's share, 8 * sum_g scale_g * (group sum of xq), is
// subtracted once per row and token (Acts::gsum).
namespace {
template <int G>
void sp_i4a8_rows(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const uint8_t* V = static_cast<const uint8_t*>(w.data);
  const int64_t kp = w.kp, kw = words_end(w), ng = kp / G;
  const auto row = [&](auto nt, int64_t r, int64_t t0) __attribute__((always_inline)) {
    constexpr int NT = decltype(nt)::value;
    const __m512i eight = _mm512_set1_epi8(8);
    const uint8_t* m = w.mask + r * (kp / 8);
    const uint8_t* vals = V + w.row_off[r];
    const float* sc = w.scale + r * ng;
    const int8_t* xq = a.xq + t0 * kp;
    __m512 acc[NT];
    __m512i dot[NT];
    for (int t = 0; t < NT; ++t) {
      acc[t] = _mm512_setzero_ps();
      dot[t] = _mm512_setzero_si512();
    }
    for (int64_t k = 0; k < kw; k += 64) {
      prefetch_ahead(vals);
      uint64_t bits;
      std::memcpy(&bits, m + k / 8, 8);
      const __m512i u = _mm512_mask_expand_epi8(
          eight, bits, _mm512_xor_si512(word_nibbles(vals), eight));
      vals += sp_i4_word_bytes(__builtin_popcountll(bits));
      for (int t = 0; t < NT; ++t)
        dot[t] = _mm512_dpbusd_epi32(dot[t], u, _mm512_loadu_si512(xq + t * kp + k));
      if (G == 32 || (k + 64) % G == 0 || k + 64 == kw) scale_group_dots<G, NT>(sc, k, dot, acc);
    }
    for (int t = 0; t < NT; ++t) {
      const float* gs = a.gsum + (t0 + t) * ng;
      float offset = 0.f;
      for (int64_t g = 0; g < ng; ++g) offset += sc[g] * gs[g];
      y[(t0 + t) * ldy + r] = (_mm512_reduce_add_ps(acc[t]) - 8.f * offset) * a.xscale[t0 + t];
    }
  };
  for_rows_and_tiles<kMaxNT4>(r0, r1, a.T, row);
}
}  // namespace

void gemv_sp_i4a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0,
                  int64_t r1) {
  with_group(w.group, [&](auto g) { sp_i4a8_rows<decltype(g)::value>(w, a, y, ldy, r0, r1); });
}


// 2:4 W8A8 (Fmt::S24_I8, layout in gemv_sparse.cpp), VNNI, two 64-column blocks per step: the
// 64 values multiply as they are stored (signed), and each token's activations are gathered to
// them with one vpermt2b over its 128 columns (as unsigned bytes, xq + 128), indexed by the
// blocks' selectors (vpmultishiftqb reads value i's out of its block's meta word) plus the
// value's group and chunk. The unsigned side's offset adds 128 * sum(w) to the dot, subtracted
// once per row. Exact int32 dots: the bits of the scalar and AVX2 kernels, for a third of the
// AVX2 kernel's instructions (its pshufb gather and int16 widening per token).
namespace {
struct S24Gather {
  alignas(64) uint8_t shift[64] = {}, base[64] = {};
  constexpr S24Gather() {
    for (int p = 0; p < 64; ++p) {
      const int i = p % 32;  // value i of block p / 32
      shift[p] = uint8_t(s24_selector_bit(i));
      base[p] = uint8_t(64 * (p / 32) + s24_group_column(i));
    }
  }
};
constexpr S24Gather kS24Gather{};
}  // namespace

void gemv_s24_i8a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0,
                   int64_t r1) {
  const int8_t* V = static_cast<const int8_t*>(w.data);
  const int64_t kp = w.kp, nb = kp / 64;
  for_rows_and_tiles<kMaxNT>(r0, r1, a.T, [&](auto nt, int64_t r, int64_t t0) {
    constexpr int NT = decltype(nt)::value;
    const __m512i offset = _mm512_set1_epi8(char(0x80)), ones = _mm512_set1_epi8(1);
    const __m512i shift = _mm512_load_si512(kS24Gather.shift);
    const __m512i base = _mm512_load_si512(kS24Gather.base);
    const int8_t* v = V + r * (kp / 2);
    const uint64_t* meta = w.meta + r * nb;
    const int8_t* xq = a.xq + t0 * kp;
    __m512i acc[NT], wsum = _mm512_setzero_si512();
    for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_si512();
    for (int64_t blk = 0; blk < nb; blk += 2) {
      const bool pair = blk + 1 < nb;  // else the row's last block alone: zeros above it
      prefetch_ahead(v + blk * 32);
      const __m512i wv = pair ? _mm512_loadu_si512(v + blk * 32)
                              : _mm512_maskz_loadu_epi8(0xffffffffull, v + blk * 32);
      const __m512i m = _mm512_inserti64x4(_mm512_set1_epi64(int64_t(meta[blk])),
                                           _mm256_set1_epi64x(pair ? int64_t(meta[blk + 1]) : 0),
                                           1);
      const __m512i idx = _mm512_add_epi8(
          _mm512_and_si512(_mm512_multishift_epi64_epi8(shift, m), _mm512_set1_epi8(3)), base);
      wsum = _mm512_dpbusd_epi32(wsum, ones, wv);
      for (int t = 0; t < NT; ++t) {
        const int8_t* x = xq + t * kp + blk * 64;
        const __m512i lo = _mm512_xor_si512(_mm512_loadu_si512(x), offset);
        const __m512i hi = pair ? _mm512_xor_si512(_mm512_loadu_si512(x + 64), offset) : offset;
        acc[t] = _mm512_dpbusd_epi32(acc[t], _mm512_permutex2var_epi8(lo, idx, hi), wv);
      }
    }
    const int32_t off = 128 * _mm512_reduce_add_epi32(wsum);
    for (int t = 0; t < NT; ++t) {
      const int32_t dot = _mm512_reduce_add_epi32(acc[t]) - off;
      y[(t0 + t) * ldy + r] = float(dot) * (a.xscale[t0 + t] * w.scale[r]);
    }
  });
}

}  // namespace sl::avx512
