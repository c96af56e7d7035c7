// Small AVX2 helpers shared by the kernels/avx2/ kernels (only include from those files).
#pragma once
#include <immintrin.h>

#include "isa.h"
#include "kernels/codegen.h"
#include "kernels.h"
#include "kernels/tiles.h"

namespace sl::avx2 {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

inline float hmax(__m256 v) {
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}

// 8 x 8 transpose: r[j] lane i <- r[i] lane j.
inline void transpose8(__m256* r) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  for (int j = 0; j < 4; ++j) {
    r[j] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x20);
    r[j + 4] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x31);
  }
}
// The same lane moves on 32-bit integers.
inline void transpose8(__m256i* r) { transpose8(reinterpret_cast<__m256*>(r)); }

// 32 int16 values (32 int8 ones widened, or 32 columns expanded): lo = 0..15, hi = 16..31.
struct I16x32 {
  __m256i lo, hi;
};
inline I16x32 widen_i8(__m256i v) {
  return {_mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)),
          _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1))};
}

// 32 int32 values (4 vectors, in order) -> 32 int8 in order, saturated to [-128, 127]: packs
// saturate and work per 128-bit lane, and the permute restores the order.
inline __m256i pack_i8(const __m256i v[4]) {
  const __m256i p =
      _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
  return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Signed int8 x signed int8 dot product of 32 lanes, accumulated into 8 int32 lanes (lane j
// gets the products of values 2j, 2j+1 and 16+2j, 17+2j). Both sides may hold -128
// (compressed-tensors' grids), which rules out the maddubs sign trick (|-128| does not fit a
// signed byte, and its pair sums can saturate int16): the values are widened to int16 and
// multiplied with madd, exact for every int8. w is widened once per weight vector by the
// caller and reused for every token.
inline __m256i dot_i8(__m256i acc, const I16x32& w, __m256i x) {
  const I16x32 xw = widen_i8(x);
  return _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(w.lo, xw.lo),
                                                _mm256_madd_epi16(w.hi, xw.hi)));
}

// Bitmask expansion (kernels/avx2/gemv_sparse.cpp, kernels/avx2/gemm_int.cpp): a mask byte indexes
// a table of shuffle controls that place the packed values in their columns.
// Built at compile time (constexpr): files compiled with -mavx2 must not run any code at load
// time on a CPU that may lack AVX2.
struct Tables {
  alignas(32) int32_t perm[256][8] = {};  // lane j <- packed value rank(j) (fp32 expansion)
  alignas(32) int32_t keep[256][8] = {};  // lane j kept ? -1 : 0
  uint64_t shuf[256] = {};  // byte j <- packed byte rank(j), or 0x80 (zero) if column j dropped
  // int16 lane j: high byte <- packed byte rank(j), low byte zero (both zero if j dropped)
  alignas(16) uint8_t spread[256][16] = {};
  constexpr Tables() {
    for (int m = 0; m < 256; ++m) {
      uint64_t s = 0;
      for (int j = 0, rank = 0; j < 8; ++j) {
        const bool on = (m >> j) & 1;
        perm[m][j] = on ? rank : 0;
        keep[m][j] = on ? -1 : 0;
        s |= uint64_t(on ? rank : 0x80) << (8 * j);
        spread[m][2 * j] = 0x80;
        spread[m][2 * j + 1] = uint8_t(on ? rank : 0x80);
        rank += on;
      }
      shuf[m] = s;
    }
  }
};
inline constexpr Tables kT{};
inline constexpr uint64_t kOnes = 0x0101010101010101ull;

inline __m128i shuf_ctrl8(uint32_t m, uint32_t offset) {
  // Adding the offset to every byte keeps 0x80 "zero" bytes >= 0x80 (offset <= 16).
  return _mm_cvtsi64_si128(int64_t(kT.shuf[m] + offset * kOnes));
}

// 16 dense int8 columns from the packed values at v: mask bytes m0 (columns 0..7), m1 (8..15).
inline __m128i expand16_i8(const int8_t* v, uint32_t m0, uint32_t m1) {
  const __m128i ctrl = _mm_set_epi64x(int64_t(kT.shuf[m1] + __builtin_popcount(m0) * kOnes),
                                      int64_t(kT.shuf[m0]));
  return _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v)), ctrl);
}

// 16 dense columns as int16 from packed int8 values: columns 0..7 (low 128-bit lane) from the
// values at v0 placed by the spread control c0 (kT.spread[mask byte]), columns 8..15 from v1
// by c1. One in-lane shuffle puts each value in the high byte of its column's int16 and the
// arithmetic shift sign-extends it: madd's operand in 4 vector instructions. Shift 12 reads
// bytes holding an int4 value in their high nibble (unpack_sp_i4_row).
template <int Shift = 8>
inline __m256i expand16_i16(const int8_t* v0, const int8_t* v1, const uint8_t* c0,
                            const uint8_t* c1) {
  const __m256i vals = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(v1),
                                           reinterpret_cast<const __m128i*>(v0));
  const __m256i ctrl = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(c1),
                                           reinterpret_cast<const __m128i*>(c0));
  return _mm256_srai_epi16(_mm256_shuffle_epi8(vals, ctrl), Shift);
}

// The 32 columns of mask bytes c .. c + 3 (4-byte mask word m) of a bitmask row as int16 from
// its values at v (which moves past them). The mask bytes become table offsets (16 bytes per
// entry) in two instructions each, where extracting and scaling a byte costs three.
template <int Shift = 8>
inline I16x32 expand32_i16(const int8_t*& v, uint32_t m) {
  const uint8_t* t = &kT.spread[0][0];
  const int8_t* v1 = v + __builtin_popcount(m & 0xff);
  const int8_t* v2 = v + __builtin_popcount(m & 0xffff);
  const int8_t* v3 = v + __builtin_popcount(m & 0xffffff);
  const I16x32 w = {
      expand16_i16<Shift>(v, v1, t + ((m << 4) & 0xff0), t + ((m >> 4) & 0xff0)),
      expand16_i16<Shift>(v2, v3, t + ((m >> 12) & 0xff0), t + ((m >> 20) & 0xff0))};
  v += __builtin_popcount(m);
  return w;
}

// A bitmask int4 row's nibble stream (SP_I4, weight.h: each 64-column word's values start on a
// byte, the even ranks in low nibbles) -> its values as bytes in rank order, each value in the
// high nibble (16 x the value as int8). The int4 kernels then expand a row as the int8 ones do
// (expand32_i16<12>, expand16_i8): per word one 32-byte load, two ands, a shift, two unpacks
// and two permutes, where expanding the nibble stream directly took two more shifts and a
// GPR-to-vector move per 16 columns. out needs
// sp_i4_row_bytes(w) bytes; bytes past the row's values are left undefined (the masks drop
// them).
inline int64_t sp_i4_row_bytes(const Weight& w) { return words_end(w) + 64; }
inline void unpack_sp_i4_row(const Weight& w, int64_t r, int8_t* out) {
  const uint8_t* src = static_cast<const uint8_t*>(w.data) + w.row_off[r];
  const uint8_t* end = static_cast<const uint8_t*>(w.data) + w.row_off[w.rows];
  const uint8_t* mask = w.mask + r * (w.kp / 8);
  const __m256i high = _mm256_set1_epi8(char(0xf0));
  for (int64_t c = 0; c < words_end(w); c += 64) {
    uint64_t m;
    __builtin_memcpy(&m, mask + c / 8, 8);
    const int n = __builtin_popcountll(m);
    __m256i b;
    if (end - src >= 32) {
      b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    } else {  // the weight's last values: do not read past them
      alignas(32) uint8_t tail[32] = {};
      __builtin_memcpy(tail, src, size_t(end - src));
      b = _mm256_load_si256(reinterpret_cast<const __m256i*>(tail));
    }
    const __m256i even = _mm256_and_si256(_mm256_slli_epi16(b, 4), high);
    const __m256i odd = _mm256_and_si256(b, high);
    const __m256i lo = _mm256_unpacklo_epi8(even, odd), hi = _mm256_unpackhi_epi8(even, odd);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permute2x128_si256(lo, hi, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32),
                        _mm256_permute2x128_si256(lo, hi, 0x31));
    out += n;
    src += sp_i4_word_bytes(n);
  }
}

// acc + the int16 dot of 32 columns (w) with 32 activation codes at x (8 int32 lanes).
inline __m256i dot_i16(__m256i acc, const I16x32& w, const int16_t* x) {
  const __m256i* xv = reinterpret_cast<const __m256i*>(x);
  const __m256i lo = _mm256_madd_epi16(w.lo, _mm256_loadu_si256(xv));
  const __m256i hi = _mm256_madd_epi16(w.hi, _mm256_loadu_si256(xv + 1));
  return _mm256_add_epi32(acc, _mm256_add_epi32(lo, hi));
}

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
}

// 2:4: build the pshufb control for one 64-column block from its selectors (see layout notes
// in kernels/scalar/gemv_sparse.cpp): qword s of the result holds slot s's 8 column indices within
// its chunk.
inline __m256i s24_control(uint64_t meta) {
  const __m256i sel = _mm256_and_si256(
      _mm256_srlv_epi64(_mm256_set1_epi64x(int64_t(meta)), _mm256_setr_epi64x(0, 2, 4, 6)),
      _mm256_set1_epi8(3));
  const __m256i base = _mm256_set1_epi64x(0x0c0c080804040000ll);  // 4 * (b / 2)
  return _mm256_add_epi8(sel, base);
}

// 2:4: one 64-column block's 32 values at v as its 64 dense int8 columns (out[0..63]). Column c
// of a chunk takes the value of its group (values 2 * (c / 4) and 2 * (c / 4) + 1 of the chunk's
// slot) whose column (s24_control) is c, else 0. Chunks 0 and 1 are held by slots 0 and 2, the
// low halves of v's two lanes, chunks 2 and 3 by slots 1 and 3, the high halves: every shuffle
// stays in its lane. About 24 instructions per block, against one store per value walking it.
inline void expand_s24_block(const int8_t* v, uint64_t meta, int8_t* out) {
  const __m256i col = s24_control(meta);
  const __m256i vals = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v));
  const __m256i c = _mm256_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
                                     0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m256i group = _mm256_setr_epi8(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6,
                                         0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);
  for (int h = 0; h < 2; ++h) {  // columns 32h .. 32h + 31: the lanes' low, then high halves
    const __m256i first = _mm256_add_epi8(group, _mm256_set1_epi8(char(8 * h)));
    const __m256i second = _mm256_add_epi8(first, _mm256_set1_epi8(1));
    const __m256i a = _mm256_and_si256(_mm256_shuffle_epi8(vals, first),
                                       _mm256_cmpeq_epi8(_mm256_shuffle_epi8(col, first), c));
    const __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(vals, second),
                                       _mm256_cmpeq_epi8(_mm256_shuffle_epi8(col, second), c));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * h), _mm256_or_si256(a, b));
  }
}

// The row scale of unscaled weights, a closure object (inlined_callables, kernels/codegen.h).
constexpr auto unit_scale = [](int64_t) { return 1.f; };

// Dense rows whose weights widen to fp32 8 at a time (fp32 / fp16 / bf16 / int8 W8A16):
// y[t, r] = row_scale(r) * dot(W[r], x[t]), W stored as V, load8(p) widens 8 of them. A = 2
// (the default): 16 columns per step, two accumulators per token (enough to stream DRAM at
// T == 1), and each pair of weight vectors is loaded / widened once for up to 5 tokens (10
// accumulators + 2 weights + 1 temporary of the 16 ymm registers): a speculative verification
// of 4 drafted tokens + 1 is one tile, and costs ~4 instructions per 16 columns per token
// instead of 12 with 4 accumulators per token and 2-token tiles. A = 4 (int8, a quarter of
// fp32's bytes per weight): 32 columns per step and 3-token tiles; with two
// accumulators a token's FMA latency chains would bound int8 at T == 1 below the DRAM stream.
template <typename V, int A = 2, typename Load8, typename RowScale>
inline void gemv_float_rows(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0,
                            int64_t r1, Load8 load8, RowScale row_scale) {
  static_assert(A == 2 || A == 4, "2 or 4 accumulators per token");
  static_assert(inlined_callables<Load8, RowScale>, "pass closure objects (kernels/codegen.h)");
  const int64_t kp = w.kp;
  const bool prefetch_one = A == 4 || prefetch_single_stream();  // at T == 1 too (tiles.h)
  for_rows_and_tiles<A == 2 ? 5 : 3>(r0, r1, a.T, [&](auto nt, int64_t r, int64_t t0) {
    constexpr int NT = decltype(nt)::value;
    const V* row = static_cast<const V*>(w.data) + r * kp;
    const float* x = a.x + t0 * kp;
    __m256 s[NT][A];
    for (int t = 0; t < NT; ++t)
      for (int i = 0; i < A; ++i) s[t][i] = _mm256_setzero_ps();
    const bool prefetch = NT > 1 || prefetch_one;
    for (int64_t k = 0; k < kp; k += 8 * A) {
      if (prefetch)
        for (int64_t b = 0; b < 8 * A * int64_t(sizeof(V)); b += 64)
          prefetch_ahead(reinterpret_cast<const char*>(row + k) + b);
      __m256 wv[A];
      for (int i = 0; i < A; ++i) wv[i] = load8(row + k + 8 * i);
      for (int t = 0; t < NT; ++t)
        for (int i = 0; i < A; ++i)
          s[t][i] = _mm256_fmadd_ps(wv[i], _mm256_loadu_ps(x + t * kp + k + 8 * i), s[t][i]);
    }
    const float sc = row_scale(r);
    for (int t = 0; t < NT; ++t) {
      __m256 sum = _mm256_add_ps(s[t][0], s[t][1]);
      if constexpr (A == 4) sum = _mm256_add_ps(sum, _mm256_add_ps(s[t][2], s[t][3]));
      y[(t0 + t) * ldy + r] = hsum(sum) * sc;
    }
  });
}

}  // namespace sl::avx2
