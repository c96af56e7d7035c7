// Prefill GEMM of int4 weights on AVX2 (no VNNI), dense (Fmt::I4, Fmt::I4K) and bitmask
// (Fmt::SP_I4). Each thread expands its weight rows, 8 at a time, into a block of unsigned
// nibbles as bytes laid out as the 16-row int8 blocks of Fmt::I8_R16 are, per 4 columns: the
// 8 rows x 4 columns in one vector. A token broadcasts its 4 int8 codes and one vpmaddubsw per
// vector multiplies all of them (I4Kernel). A weight is expanded once per chunk and an
// activation quantized once per chunk, where the GEMVs widen the same values per token tile.
// Bitmask int4's signed nibbles q are expanded as u = q + 8 (dropped columns 8, zero point 8).
// It serves W4A8 and, for a prompt, weight-only int4 with x quantized per weight group
// (quantize_groups, the AVX-512 GEMM's codes); bitmask int4 in an int16 kernel, with a dot per
// group, was far slower. W8A8 prefill is the fp32 panel GEMM on the integer codes
// (kernels/avx2/gemm.cpp panel_gemm_codes); weight-only int8 and bitmask int8 prompts keep the
// fp32 panel GEMM: with x quantized per group of 32 columns, as the AVX-512 int8 GEMM does, a
// dot per 32 columns was slower than the fp32 GEMM.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "formats.h"
#include "aligned.h"
#include "kernels.h"
#include "kernels/avx2/simd.h"

namespace sl::avx2 {

namespace {

constexpr int64_t kRows = 8;  // rows per expanded block

// Row streams: begin(i, row) starts slot i on a weight row, next(i, k) returns its unsigned
// nibbles as bytes at columns [k, k + 32) (called for k = 0, 32, ... in order).
struct I4Rows {  // Fmt::I4: a 16-byte block -> its 32 unsigned nibbles in column order
  const Weight& w;
  const uint8_t* q[kRows];
  void begin(int i, int64_t r) { q[i] = static_cast<const uint8_t*>(w.data) + r * (w.kp / 2); }
  __m256i next(int i, int64_t k) const {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q[i] + k / 2));
    const __m128i low4 = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), low4), _mm_and_si128(b, low4));
  }
};

struct SpI8Rows {  // bitmask rows of bytes: 32 columns = 4 mask bytes, expanded by table shuffles
  const Weight& w;
  const int8_t* v[kRows];
  const uint8_t* m[kRows];
  void begin(int i, int64_t r) {
    v[i] = static_cast<const int8_t*>(w.data) + w.row_off[r];
    m[i] = w.mask + r * (w.kp / 8);
  }
  __m256i next(int i, int64_t k) {
    const uint32_t m4 = load_u32(m[i] + k / 8);
    const int n01 = __builtin_popcount(m4 & 0xffffu);
    const __m256i e = _mm256_set_m128i(expand16_i8(v[i] + n01, (m4 >> 16) & 255, m4 >> 24),
                                       expand16_i8(v[i], m4 & 255, (m4 >> 8) & 255));
    v[i] += __builtin_popcount(m4);
    return e;
  }
};

// Fmt::SP_I4: each row's nibbles unpacked to bytes 16 q (unpack_sp_i4_row, into buf: kRows
// rows of sp_i4_row_bytes), expanded as SP_I8's, then made I4Kernel's unsigned u = q + 8: the
// high nibble moved down and its sign bit flipped (a dropped column's 0 becomes 8, zero too).
struct SpI4Rows : SpI8Rows {
  int8_t* buf;
  void begin(int i, int64_t r) {
    int8_t* row = buf + i * sp_i4_row_bytes(w);
    unpack_sp_i4_row(w, r, row);
    v[i] = row;
    m[i] = w.mask + r * (w.kp / 8);
  }
  __m256i next(int i, int64_t k) {
    const __m256i q = _mm256_and_si256(_mm256_srli_epi16(SpI8Rows::next(i, k), 4),
                                       _mm256_set1_epi8(0x0f));
    return _mm256_xor_si256(q, _mm256_set1_epi8(8));
  }
};

// 32 bytes = 8 rows x 4 columns (row-major) -> the block.
inline void store_codes(__m256i v, uint8_t* out) {
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), v);
}

// Rows [r, min(r + 8, r1)) -> one block of kRows * kp codes (rows past r1: zeros).
template <class Rows>
void expand_block(const Weight& w, Rows& rows, int64_t r, int64_t r1, uint8_t* blk) {
  const int n = int(std::min<int64_t>(kRows, r1 - r));
  for (int i = 0; i < n; ++i) rows.begin(i, r + i);
  for (int64_t k = 0; k < w.kp; k += 32) {
    __m256i v[kRows];
    for (int i = 0; i < kRows; ++i) v[i] = i < n ? rows.next(i, k) : _mm256_setzero_si256();
    transpose8(v);  // vector j: columns k + 4j .. k + 4j + 3 of the 8 rows
    for (int j = 0; j < kRows; ++j) store_codes(v[j], blk + 8 * (k + 4 * j));
  }
}

// One token's 8 outputs (rows r .. r + n - 1 of y are stored).
inline void store_rows(__m256 out, float* y, int64_t n) {
  if (n == kRows) {
    _mm256_storeu_ps(y, out);
  } else {
    alignas(32) float tmp[kRows];
    _mm256_store_ps(tmp, out);
    std::memcpy(y, tmp, size_t(n) * sizeof(float));
  }
}

// Runs k.tile<NT>(t0) over all tokens, NT = K::kMaxNT but for a shorter last tile.
template <class K, int NT = K::kMaxNT>
void tail(const K& k, int64_t m, int64_t t0) {
  if constexpr (NT > 1)
    if (m < NT) return tail<K, NT - 1>(k, m, t0);
  k.template tile<NT>(t0);
}
template <class K>
void run_tiles(const K& k, int64_t T) {
  for (int64_t t0 = 0; t0 < T; t0 += K::kMaxNT) tail(k, std::min<int64_t>(K::kMaxNT, T - t0), t0);
}

// Fmt::I4: the block holds the nibbles u as bytes, so one vpmaddubsw multiplies a vector (8
// rows x 4 columns) by a token's 4 int8 codes into 16 int16 pair sums, exact (|u x| <= 15 *
// 128), and 8 of them (32 columns) sum to at most 30720, no saturation. Every 32 columns a
// vpmaddwd by ones joins each row's pairs into its dot (lane i: row i), the zero point comes off
// as z * (the token's sum of those codes), exact in fp32 (integers below 2^24), and the dot
// times its scale is added to the token's fp32 accumulator: per 4 columns and token one maddubs
// and one add, where int16 codes take two madds and two adds. 6 tokens per tile: 6 int16
// + 6 fp32 accumulators, the weight vector, the broadcast and the ones (15 ymm).
// kTokenScale: W4A8 (x scaled per token, applied at the end); else x is quantized per weight
// group, and each group's dot is scaled by the weight's scale times the token's.
// K (Fmt::I4K): zp holds each group's min m' (weight.h), which comes off the scaled dot as
// m' * the code sum, s * dot - m' * sum, before the token's scale.
template <int G, bool kTokenScale, bool K>
struct I4Kernel {
  const uint8_t* blk;  // kRows * kp nibbles in the block layout
  const float* sc;     // the block's scales: (groups, 8)
  const float* zp;     // the block's zero points (K: mins): (groups, 8)
  const GemmActs& a;
  int64_t kp;
  float* y;
  int64_t ldy, r, n;
  static constexpr int kMaxNT = 6;

  template <int NT>
  [[gnu::noinline]] void tile(int64_t t0) const {
    const int8_t* xq = a.xq + t0 * kp;
    const float* gs = a.gsum + t0 * (kp / 32);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t k0 = 0; k0 < kp; k0 += 32) {
      __m256i d[NT];
      for (int t = 0; t < NT; ++t) d[t] = _mm256_setzero_si256();
      // (Not unrolled: GCC then hoists the broadcasts and spills.)
      for (int64_t k = k0; k < k0 + 32; k += 4) {
        const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(blk + 8 * k));
        for (int t = 0; t < NT; ++t) {
          int32_t x4;
          std::memcpy(&x4, xq + t * kp + k, 4);
          d[t] = _mm256_add_epi16(d[t], _mm256_maddubs_epi16(w, _mm256_set1_epi32(x4)));
        }
      }
      const int64_t g = k0 / G;
      const __m256 z = _mm256_load_ps(zp + g * kRows), s = _mm256_load_ps(sc + g * kRows);
      for (int t = 0; t < NT; ++t) {
        const __m256 sum = _mm256_set1_ps(gs[t * (kp / 32) + k0 / 32]);
        const __m256 di = _mm256_cvtepi32_ps(_mm256_madd_epi16(d[t], ones));
        if constexpr (K) {
          const __m256 v = _mm256_fnmadd_ps(z, sum, _mm256_mul_ps(di, s));
          acc[t] = kTokenScale ? _mm256_add_ps(acc[t], v)
                               : _mm256_fmadd_ps(v, _mm256_set1_ps(a.xs[(t0 + t) * (kp / G) + g]),
                                                 acc[t]);
          continue;
        }
        const __m256 dot = _mm256_fnmadd_ps(z, sum, di);
        const __m256 st =
            kTokenScale ? s : _mm256_mul_ps(s, _mm256_set1_ps(a.xs[(t0 + t) * (kp / G) + g]));
        acc[t] = _mm256_fmadd_ps(dot, st, acc[t]);
      }
    }
    for (int t = 0; t < NT; ++t)
      store_rows(kTokenScale ? _mm256_mul_ps(acc[t], _mm256_set1_ps(a.xs[t0 + t])) : acc[t],
                 y + (t0 + t) * ldy + r, n);
  }
};

// One thread's expanded block, its scales and zero points.
struct Expanded {
  AlignedVector<uint8_t> nibbles; // (kRows, kp) in the block layout
  AlignedVector<int8_t> rows;     // SP_I4: (kRows, sp_i4_row_bytes) unpacked rows
  AlignedVector<float> scale;     // (groups, kRows)
  AlignedVector<float> zero;      // (groups, kRows)
};

// Rows [r, r + n)'s scales (w.scale is (rows, groups)) and zero points -> ex, per
// group; rows past n get 0 (their outputs are not stored). Bitmask int4 is symmetric: its
// unsigned codes q + 8 (SpI4Rows) have the zero point 8, as symmetric dense int4's do.
void expand_scales(const Weight& w, int64_t r, int64_t n, Expanded& ex) {
  const int64_t groups = scale_groups(w);
  for (int64_t i = 0; i < kRows; ++i)
    for (int64_t g = 0; g < groups; ++g) {
      if (w.fmt == Fmt::I4K) {
        ex.scale[g * kRows + i] = i < n ? i4k_scale(w, r + i, g) : 0.f;
        ex.zero[g * kRows + i] = i < n ? i4k_min(w, r + i, g) : 0.f;
        continue;
      }
      ex.scale[g * kRows + i] = i < n ? w.scale[(r + i) * groups + g] : 0.f;
      ex.zero[g * kRows + i] = w.asym && i < n ? w.zero[(r + i) * groups + g] : 8.f;
    }
}

template <class Rows>
void gemm_i4(const Weight& w, const GemmActs& a, float* y, int64_t ldy, int64_t r0, int64_t r1,
             Rows&& rows, Expanded& ex) {
  with_group(w.group, [&](auto g) {
    constexpr int G = decltype(g)::value;
    for (int64_t r = r0; r < r1; r += kRows) {
      const int64_t n = std::min(kRows, r1 - r);
      expand_block(w, rows, r, r1, ex.nibbles.data());
      expand_scales(w, r, n, ex);
      auto run = [&](auto token_scale, auto k) {
        run_tiles(I4Kernel<G, decltype(token_scale)::value, decltype(k)::value>{
                      ex.nibbles.data(), ex.scale.data(), ex.zero.data(), a, w.kp, y, ldy, r, n},
                  a.T);
      };
      const auto with_k = [&](auto token_scale) {
        if (w.fmt == Fmt::I4K) run(token_scale, std::true_type{});
        else run(token_scale, std::false_type{});
      };
      if (w.act_int8) with_k(std::true_type{});
      else with_k(std::false_type{});
    }
  });
}

}  // namespace

void int_gemm(const Weight& w, const GemmActs& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  thread_local Expanded ex;
  const size_t codes = size_t(kRows * w.kp), scales = size_t(kRows * scale_groups(w));
  auto grow = [](auto& v, size_t size) {
    if (v.size() < size) v.resize(size);
  };
  grow(ex.scale, scales);
  grow(ex.nibbles, codes);
  grow(ex.zero, scales);
  if (w.fmt == Fmt::I4 || w.fmt == Fmt::I4K)  // the same nibbles
    return gemm_i4(w, a, y, ldy, r0, r1, I4Rows{w, {}}, ex);
  grow(ex.rows, size_t(kRows * sp_i4_row_bytes(w)));
  gemm_i4(w, a, y, ldy, r0, r1, SpI4Rows{{w, {}, {}}, ex.rows.data()}, ex);
}

// One row x (kp) -> int8 codes q and scales xs per `group` columns, as avx512::quantize_groups
// (its codes without the + 128): q = rint(x * (127 / max|x|)), scale max|x| / 127 (0 and q = 0
// for an all-zero group, or one whose 127 / max overflows).
void quantize_groups(const float* x, int64_t kp, int64_t group, int8_t* q, float* xs) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t k = 0; k < kp; k += group) {
    __m256 m = _mm256_setzero_ps();
    for (int64_t i = k; i < k + group; i += 8)
      m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + i), absmask));
    const float amax = hmax(m), inv = 127.f / amax;
    if (!(inv < INFINITY)) {  // amax 0 or subnormal
      std::memset(q + k, 0, size_t(group));
      xs[k / group] = 0.f;
      continue;
    }
    xs[k / group] = amax / 127.f;
    const __m256 s = _mm256_set1_ps(inv);
    for (int64_t i = k; i < k + group; i += 32) {  // |x * inv| <= 127: packs never saturate
      __m256i v[4];
      for (int j = 0; j < 4; ++j)
        v[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * j), s));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), pack_i8(v));
    }
  }
}

void widen_codes(const int8_t* q, int64_t n, int16_t* xw) {
  for (int64_t i = 0; i < n; i += 16)
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(xw + i),
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i))));
}

}  // namespace sl::avx2
