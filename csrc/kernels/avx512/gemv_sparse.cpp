// Sparse GEMV, AVX-512 (layouts documented in kernels/scalar/gemv_sparse.cpp): bitmask W8A8
// with VBMI2 and 2:4 W8A8 with VBMI (VNNI), bitmask int4 with VBMI (W4A16, and W4A8 with VNNI),
// and on fp32 activations bitmask and 2:4 int8 (W8A16) and bitmask fp32 (widened to fp32,
// gemv.h). Compiled with this folder's flags; only called when runtime/cpu.cpp found
// AVX512F/BW/VL/VNNI/VBMI/VBMI2.
//
// The bitmask format expands a row's packed values to 64 dense columns with one vpexpandb per
// 64-bit mask word (AVX2 needs ~10 instructions per 16 columns, see kernels/avx2/gemv_sparse.cpp):
// dropped columns get the offset byte, 0x80, i.e. weight 0.
#include "kernels/avx512/gemv.h"

namespace sl::avx512 {

namespace {
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

// The bitmask kernels read up to 63 bytes past a row's last value: the packed values end with
// 64 bytes of padding (formats._VALUE_PAD).
void gemv_sp_i8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const int8_t* V = static_cast<const int8_t*>(w.data);
  widen_rows(w, a, y, ldy, r0, r1, [&](int64_t r) {
    return [v = V + w.row_off[r], m = w.mask + r * (w.kp / 8)](__m512* wf) mutable {
      prefetch_ahead(v);
      prefetch_ahead(m);
      uint64_t bits;
      std::memcpy(&bits, m, 8);
      const __m512i e = _mm512_maskz_expand_epi8(bits, _mm512_loadu_si512(v));
      wf[0] = widen16(_mm512_castsi512_si128(e));
      wf[1] = widen16(_mm512_extracti32x4_epi32(e, 1));
      wf[2] = widen16(_mm512_extracti32x4_epi32(e, 2));
      wf[3] = widen16(_mm512_extracti32x4_epi32(e, 3));
      v += __builtin_popcountll(bits);
      m += 8;
    };
  });
}

void gemv_sp_f32(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const float* V = static_cast<const float*>(w.data);
  widen_rows(w, a, y, ldy, r0, r1, [&](int64_t r) {
    return [v = V + w.row_off[r], m = w.mask + r * (w.kp / 8)](__m512* wf) mutable {
      prefetch_ahead(v);
      prefetch_ahead(v + 16);
      prefetch_ahead(m);
      for (int i = 0; i < 4; ++i) {
        uint16_t bits;
        std::memcpy(&bits, m + 2 * i, 2);
        wf[i] = _mm512_maskz_expand_ps(bits, _mm512_loadu_ps(v));
        v += __builtin_popcount(bits);
      }
      m += 8;
    };
  });
}

// 2:4 int8 (Fmt::S24_I8, layout in gemv_sparse.cpp): its 32 values per 64 columns widen to fp32
// as stored, and each token's activations are gathered to them, 16 at a time with a vpermt2ps
// over the two 16-column chunks a pair of slots holds (slots 0 and 1: chunks 0 and 2; slots 2
// and 3: chunks 1 and 3), indexed by the selectors (vpmultishiftqb) plus the value's group.
// Half the conversions of expanding to 64 columns first.
namespace {
struct S24Index {
  alignas(32) uint8_t shift[32] = {}, base[32] = {};
  constexpr S24Index() {
    for (int i = 0; i < 32; ++i) {
      const int s = i / 8, b = i % 8;
      shift[i] = uint8_t(s24_selector_bit(i));
      base[i] = uint8_t(16 * (s % 2) + 4 * (b / 2));
    }
  }
};
constexpr S24Index kS24Index{};
constexpr int kMaxNTS24 = 5;  // 4 accumulators per token, as widen_rows
}  // namespace

void gemv_s24_i8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const int8_t* V = static_cast<const int8_t*>(w.data);
  const int64_t kp = w.kp, nb = kp / 64;
  const auto row = [&](auto nt, int64_t r, int64_t t0) __attribute__((always_inline)) {
    constexpr int NT = decltype(nt)::value;
    const __m256i shift = _mm256_load_si256(reinterpret_cast<const __m256i*>(kS24Index.shift));
    const __m256i base = _mm256_load_si256(reinterpret_cast<const __m256i*>(kS24Index.base));
    const int8_t* v = V + r * (kp / 2);
    const uint64_t* meta = w.meta + r * nb;
    const float* x0 = a.x + t0 * kp;
    __m512 acc[NT][4];  // per token: slots 0-1 and 2-3, even and odd blocks
    for (int t = 0; t < NT; ++t)
      for (int i = 0; i < 4; ++i) acc[t][i] = _mm512_setzero_ps();
    for (int64_t blk = 0; blk < nb; ++blk) {
      prefetch_ahead(v + blk * 32);
      const __m256i idx8 = _mm256_add_epi8(
          _mm256_and_si256(_mm256_multishift_epi64_epi8(shift, _mm256_set1_epi64x(int64_t(meta[blk]))),
                           _mm256_set1_epi8(3)),
          base);
      const __m512i idx0 = _mm512_cvtepu8_epi32(_mm256_castsi256_si128(idx8));
      const __m512i idx1 = _mm512_cvtepu8_epi32(_mm256_extracti128_si256(idx8, 1));
      const __m512 w0 = widen16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + blk * 32)));
      const __m512 w1 =
          widen16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + blk * 32 + 16)));
      const int p = 2 * int(blk & 1);
      for (int t = 0; t < NT; ++t) {
        const float* x = x0 + t * kp + blk * 64;
        const __m512 g0 =
            _mm512_permutex2var_ps(_mm512_loadu_ps(x), idx0, _mm512_loadu_ps(x + 32));
        const __m512 g1 =
            _mm512_permutex2var_ps(_mm512_loadu_ps(x + 16), idx1, _mm512_loadu_ps(x + 48));
        acc[t][p] = _mm512_fmadd_ps(w0, g0, acc[t][p]);
        acc[t][p + 1] = _mm512_fmadd_ps(w1, g1, acc[t][p + 1]);
      }
    }
    for (int t = 0; t < NT; ++t)
      y[(t0 + t) * ldy + r] = reduce_add4(acc[t]) * w.scale[r];
  };
  for_rows_and_tiles<kMaxNTS24>(r0, r1, a.T, row);
}

}  // namespace sl::avx512
