// GEMVs on fp32 activations whose weights widen to fp32, AVX-512 (F, BW, VBMI, VBMI2):
// weight-only int8 (W8A16), dense, bitmask- and 2:4-sparse, and bitmask-sparse fp32.
//
// A row is walked 64 columns at a time: the step yields four 16-lane fp32 weight vectors
// (int8: one widening vpmovsxbd and one conversion per 16; bitmask: the 64-bit mask word's
// kept values expanded to their columns first, vpexpandb / vexpandps, dropped columns 0), and
// every token of the tile FMAs them into its own four accumulators. On AVX2 the same rows take
// 8 columns per instruction and the bitmask ones a table-driven expansion per mask byte.
#include <immintrin.h>

#include <cstring>

#include "common.h"
#include "simd_avx512.h"
#include "tiles.h"

namespace sl::avx512 {

namespace {
// 4 accumulators per token + 4 weight vectors: 5 tokens fill 24 of the 32 zmm registers (a
// speculative verification of 4 drafted tokens + 1 is one tile).
constexpr int kMaxNT = 5;

// y[t, r] = dot(W[r], x[t]) * scale[r] (integer values; fp32 ones: 1) for rows [r0, r1):
// row64(r) returns the row's stream, a callable filling w[4] with the fp32 weights of its next
// 64 columns.
template <class Row64>
inline void widen_rows(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0,
                       int64_t r1, Row64 row64) {
  const int64_t kp = w.kp;
  const bool scaled = !fmt_traits(w.fmt).is_float;
  const auto row = [&](auto nt, int64_t r, int64_t t0) __attribute__((always_inline)) {
    constexpr int NT = decltype(nt)::value;
    auto next = row64(r);
    const float* x = a.x + t0 * kp;
    __m512 acc[NT][4];
    for (int t = 0; t < NT; ++t)
      for (int i = 0; i < 4; ++i) acc[t][i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kp; k += 64) {
      __m512 wf[4];
      next(wf);
      for (int t = 0; t < NT; ++t)
        for (int i = 0; i < 4; ++i)
          acc[t][i] = _mm512_fmadd_ps(wf[i], _mm512_loadu_ps(x + t * kp + k + 16 * i), acc[t][i]);
    }
    const float s = scaled ? w.scale[r] : 1.f;
    for (int t = 0; t < NT; ++t)
      y[(t0 + t) * ldy + r] = reduce_add4(acc[t]) * s;
  };
  for_rows_and_tiles<kMaxNT>(r0, r1, a.T, row);
}

inline __m512 widen16(__m128i q) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)); }
}  // namespace

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
