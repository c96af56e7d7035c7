// Prefill GEMM of the integer weight formats with AVX-512 VNNI. Each thread expands its weight
// rows, 128 at a time, into 16-row int8 blocks (Fmt::I8_R16's layout, weight.h, with signed
// values: w - z for int4), and multiplies them by the chunk's activations as unsigned bytes
// (x + 128). The unsigned side's offset adds 128 * sum(w) to a dot product: a block stores
// -128 * sum(w) per period of columns, and each dot product starts from it.
//
// The micro-kernel keeps 2 blocks (32 rows) x up to 8 tokens of accumulators in registers: per
// 4 columns, 2 weight loads and one broadcast per token feed 2 vpdpbusd, where the GEMV's
// 16-row kernel (one block x 8 tokens) spends a broadcast per vpdpbusd and reaches about a
// third of the port's peak.
//
// Scales: per-row weights (int8) with per-token activations (W8A8) keep the whole row's dot in
// int32, y = float(dot) * (xscale * scale), the GEMV's float operations: the same bits. Int4
// groups, and activations quantized per group of columns, end a dot every period of E columns:
// acc += float(dot) * scale, in fp32.
//
// Activations: W8A8 / W4A8 use the per-token int8 the GEMV uses. Weight-only prompts (W4A16,
// W8A16) quantize x dynamically per group of columns (scale max|x| / 127): int4 per weight
// group, int8 per 32 columns. That is how llama.cpp multiplies its Q4_0 / Q8_0 / K-quant
// weights and what OpenVINO's CPU plugin does by default, so their prefill is an int8 GEMM too;
// decode keeps fp32 activations.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "formats.h"
#include "aligned.h"
#include "kernels/codegen.h"
#include "kernels.h"
#include "kernels/avx512/simd.h"

namespace sl::avx512 {

namespace {

constexpr int64_t kExpandRows = 128;  // rows expanded at a time: 8 blocks, L2-resident
constexpr int kNB = 2;                // blocks per micro-kernel call

// Columns per int32 dot: 0 for a whole row (W8A8), else the weight's or the activations' group.
int64_t dot_period(const Weight& w) {
  return fmt_traits(w.fmt).grouped ? w.group : int_gemm_act_group(w);
}


// Row streams: begin(i, row) starts slot i on a weight row, next(i, k) returns its signed
// values at columns [k, k + 64) (called for k = 0, 64, ... in order).
struct NoRows {  // Fmt::I8_R16 is stored as blocks already (expand() copies them)
  void begin(int, int64_t) {}
  __m512i next(int, int64_t) { return _mm512_setzero_si512(); }
};

// The bitmask formats' rows: each slot's packed values (V: int8, or bytes of nibbles) and mask.
template <typename V>
struct BitmaskRows {
  const Weight& w;
  const V* v[16] = {};
  const uint8_t* m[16] = {};
  void begin(int i, int64_t r) {
    v[i] = static_cast<const V*>(w.data) + w.row_off[r];
    m[i] = w.mask + r * (w.kp / 8);
  }
  uint64_t bits(int i, int64_t k) const {  // the mask word of columns [k, k + 64)
    uint64_t b;
    std::memcpy(&b, m[i] + k / 8, 8);
    return b;
  }
};

struct I8Rows {  // Fmt::I8: row-major values
  const Weight& w;
  const int8_t* q[16];
  void begin(int i, int64_t r) { q[i] = static_cast<const int8_t*>(w.data) + r * w.kp; }
  __m512i next(int i, int64_t k) { return _mm512_loadu_si512(q[i] + k); }
};

struct SpI8Rows : BitmaskRows<int8_t> {  // Fmt::SP_I8: a word's values expanded to its columns
  __m512i next(int i, int64_t k) {
    const uint64_t b = bits(i, k);
    const __m512i e = _mm512_maskz_expand_epi8(b, _mm512_loadu_si512(v[i]));
    v[i] += __builtin_popcountll(b);
    return e;
  }
};

template <int G>
struct I4Rows {  // Fmt::I4: two 16-byte blocks -> 64 nibbles in column order, minus z
  const Weight& w;
  const uint8_t* q[16];
  const uint8_t* z[16];
  void begin(int i, int64_t r) {
    q[i] = static_cast<const uint8_t*>(w.data) + r * (w.kp / 2);
    z[i] = w.asym ? w.zero + r * (w.kp / G) : nullptr;
  }
  __m512i next(int i, int64_t k) {
    const __m512i u = i4_columns64(q[i] + k / 2);
    if (!z[i]) return _mm512_sub_epi8(u, _mm512_set1_epi8(8));
    const __m512i zp = G == 32 ? _mm512_inserti64x4(_mm512_set1_epi8(char(z[i][k / 32])),
                                                    _mm256_set1_epi8(char(z[i][k / 32 + 1])), 1)
                               : _mm512_set1_epi8(char(z[i][k / G]));
    return _mm512_sub_epi8(u, zp);
  }
};

struct SpI4Rows : BitmaskRows<uint8_t> {  // Fmt::SP_I4: a word's signed nibbles, expanded
  __m512i next(int i, int64_t k) {
    if (k >= words_end(w)) return _mm512_setzero_si512();  // a padding word
    const uint64_t b = bits(i, k);
    // nibble n (two's complement int4; dropped columns 0) -> (n ^ 8) - 8
    const __m512i e = _mm512_maskz_expand_epi8(b, word_nibbles(v[i]));
    v[i] += sp_i4_word_bytes(__builtin_popcountll(b));
    const __m512i eight = _mm512_set1_epi8(8);
    return _mm512_sub_epi8(_mm512_xor_si512(e, eight), eight);
  }
};

// Fmt::S24_I8 (kernels/scalar/gemv_sparse.cpp): a 64-column block's 32 values and 2-bit selectors.
// The values are arranged with a vpermb so that 128-bit lane c holds chunk c's 8 (columns
// 16c..16c+15), and a vpshufb places them: column j of the lane is group m = j / 4, which holds
// values 2m (at j % 4 == sel(2m)) and 2m + 1 (at sel(2m + 1), which wins a tie, as in the scalar
// walk); vpmultishiftqb reads each byte's two selectors out of the broadcast meta word.
struct S24Tables {
  alignas(64) uint8_t arrange[64] = {}, sel0[64] = {}, sel1[64] = {}, idx0[64] = {},
                      idx1[64] = {}, col[64] = {};
  constexpr S24Tables() {
    for (int p = 0; p < 64; ++p) {
      const int c = p / 16, j = p % 16, slot = kSlotChunk[c], m = j / 4;
      arrange[p] = uint8_t(j < 8 ? 8 * slot + j : 0);
      sel0[p] = uint8_t(s24_selector_bit(8 * slot + 2 * m));  // value 2m's selector
      sel1[p] = uint8_t(s24_selector_bit(8 * slot + 2 * m + 1));
      idx0[p] = uint8_t(2 * m);
      idx1[p] = uint8_t(2 * m + 1);
      col[p] = uint8_t(j % 4);
    }
  }
};
constexpr S24Tables kS24{};

struct S24Rows {
  const Weight& w;
  const int8_t* v[16];
  const uint64_t* m[16];
  void begin(int i, int64_t r) {
    v[i] = static_cast<const int8_t*>(w.data) + r * (w.kp / 2);
    m[i] = w.meta + r * (w.kp / 64);
  }
  __m512i next(int i, int64_t k) {
    const auto table = [](const uint8_t* t) { return _mm512_load_si512(t); };
    const __m512i vals = _mm512_permutexvar_epi8(
        table(kS24.arrange),
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v[i] + k / 2))));
    const __m512i meta = _mm512_set1_epi64(int64_t(m[i][k / 64])), three = _mm512_set1_epi8(3);
    const __m512i s0 = _mm512_and_si512(_mm512_multishift_epi64_epi8(table(kS24.sel0), meta), three);
    const __m512i s1 = _mm512_and_si512(_mm512_multishift_epi64_epi8(table(kS24.sel1), meta), three);
    const __m512i col = table(kS24.col);
    __m512i ctrl = _mm512_mask_mov_epi8(_mm512_set1_epi8(char(0x80)),
                                        _mm512_cmpeq_epi8_mask(col, s0), table(kS24.idx0));
    ctrl = _mm512_mask_mov_epi8(ctrl, _mm512_cmpeq_epi8_mask(col, s1), table(kS24.idx1));
    return _mm512_shuffle_epi8(vals, ctrl);
  }
};

// Rows [r, min(r + 16, r1)) -> one block (rows past r1: zeros).
template <class Rows>
void expand_block(const Weight& w, Rows& rows, int64_t r, int64_t r1, int8_t* blk) {
  const int n = int(std::min<int64_t>(kRowBlock16, r1 - r));
  for (int i = 0; i < n; ++i) rows.begin(i, r + i);
  for (int64_t k = 0; k < w.kp; k += 64) {
    __m512 v[16];
    for (int i = 0; i < 16; ++i)
      v[i] = i < n ? _mm512_castsi512_ps(rows.next(i, k)) : _mm512_setzero_ps();
    transpose16(v);  // vector j: columns k + 4j .. k + 4j + 3 of the 16 rows
    for (int j = 0; j < 16; ++j)
      _mm512_store_ps(reinterpret_cast<float*>(blk + 16 * (k + 4 * j)), v[j]);
  }
}

// One thread's expanded rows: blocks, per period the -128 * sum(w) each dot starts from, and
// the weight scales the kernel multiplies (per weight group, or per row).
struct Expanded {
  AlignedVector<int8_t> blocks;  // (nb, 16 * kp)
  AlignedVector<int32_t> start;  // (nb, periods, 16)
  AlignedVector<float> scale;    // (nb, groups or 1, 16)
};

// The kernel's scales, weights' x activations'. W8A8 (E == 0): per row x per token, one int32
// dot per row. Else a dot per period of E columns: W4A8, per int4 group (E) x per token; W4A16,
// per group x per group (the activations quantized per weight group); W8A16, per row x per
// group of E columns (the row's scale multiplies once, at the end).
enum class Scales { kRowToken, kGroupToken, kGroupGroup, kRowGroup };

struct Plan {
  int64_t kp, periods, groups;  // groups: the weight's scales per row
};

// Blocks for rows [ra, rz): an even number (the micro-kernel takes 2), zeros past rz.
inline int64_t blocks_for(int64_t ra, int64_t rz) {
  return (rz - ra + 2 * kRowBlock16 - 1) / (2 * kRowBlock16) * 2;
}

template <int E, Scales S>
struct Kernel {
  const Plan& pl;
  const Expanded& ex;
  const GemmActs& a;
  float* y;
  int64_t ldy, r, r1;  // the expanded rows start at r; rows from r1 on are not stored

  template <int NT>
  [[gnu::noinline]] void tile(int64_t b, int64_t t0) const {
    const int64_t kp = pl.kp;
    const int8_t* w0 = ex.blocks.data() + b * kRowBlock16 * kp;
    const int8_t* w1 = w0 + kRowBlock16 * kp;
    const uint8_t* xu = a.xu + t0 * kp;
    const int32_t* st = ex.start.data() + b * pl.periods * 16;
    const float* sc = ex.scale.data() + b * pl.groups * 16;
    // Per period: each dot starts from the block's -128 * sum(w), takes E columns (E == 0: one
    // period of kp, the whole row, in steps of 64), and is scaled into acc at its end.
    constexpr int64_t kStep = E ? E : 64;
    __m512i dot[kNB][NT];
    __m512 acc[kNB][NT];
    SL_UNROLL for (int i = 0; i < kNB; ++i)
      SL_UNROLL for (int t = 0; t < NT; ++t) acc[i][t] = _mm512_setzero_ps();
    for (int64_t k0 = 0; k0 < kp; k0 += kStep) {
      const int64_t p = E ? k0 / E : 0;
      if (E || k0 == 0) {
        SL_UNROLL for (int i = 0; i < kNB; ++i) {
          const __m512i s = _mm512_load_si512(st + (i * pl.periods + p) * 16);
          SL_UNROLL for (int t = 0; t < NT; ++t) dot[i][t] = s;
        }
      }
      _Pragma("GCC unroll 32") for (int64_t j = 0; j < kStep; j += 4) {
        const int64_t k = k0 + j;
        const __m512i wa = _mm512_load_si512(w0 + 16 * k), wb = _mm512_load_si512(w1 + 16 * k);
        SL_UNROLL for (int t = 0; t < NT; ++t) {
          int32_t x4;
          std::memcpy(&x4, xu + t * kp + k, 4);
          const __m512i xb = _mm512_set1_epi32(x4);
          dot[0][t] = _mm512_dpbusd_epi32(dot[0][t], xb, wa);
          dot[1][t] = _mm512_dpbusd_epi32(dot[1][t], xb, wb);
        }
      }
      if constexpr (S == Scales::kRowGroup) {
        SL_UNROLL for (int t = 0; t < NT; ++t) {
          const __m512 xs = _mm512_set1_ps(a.xs[(t0 + t) * pl.periods + p]);
          SL_UNROLL for (int i = 0; i < kNB; ++i)
            acc[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i][t]), xs, acc[i][t]);
        }
      } else if constexpr (E > 0) {
        SL_UNROLL for (int i = 0; i < kNB; ++i) {
          const __m512 ws = _mm512_load_ps(sc + (i * pl.groups + p) * 16);
          SL_UNROLL for (int t = 0; t < NT; ++t) {
            const __m512 m =
                S == Scales::kGroupGroup
                    ? _mm512_mul_ps(ws, _mm512_set1_ps(a.xs[(t0 + t) * pl.periods + p]))
                    : ws;
            acc[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i][t]), m, acc[i][t]);
          }
        }
      }
    }
    SL_UNROLL for (int i = 0; i < kNB; ++i) {
      const int64_t row = r + (b + i) * kRowBlock16;
      if (row >= r1) break;
      const __mmask16 store = r1 - row >= 16 ? 0xffff : (1u << (r1 - row)) - 1;
      SL_UNROLL for (int t = 0; t < NT; ++t) {
        __m512 out;
        if constexpr (S == Scales::kRowToken)  // W8A8: float(dot) * (xscale * scale), as the GEMV
          out = _mm512_mul_ps(_mm512_cvtepi32_ps(dot[i][t]),
                              _mm512_mul_ps(_mm512_set1_ps(a.xs[t0 + t]),
                                            _mm512_load_ps(sc + i * 16)));
        else if constexpr (S == Scales::kGroupToken)
          out = _mm512_mul_ps(acc[i][t], _mm512_set1_ps(a.xs[t0 + t]));
        else if constexpr (S == Scales::kGroupGroup)
          out = acc[i][t];
        else
          out = _mm512_mul_ps(acc[i][t], _mm512_load_ps(sc + i * 16));
        _mm512_mask_storeu_ps(y + (t0 + t) * ldy + row, store, out);
      }
    }
  }

  // Tokens per tile: 8 when only int32 accumulators live in registers, 7 with fp32 ones too
  // (28 of the 32 vector registers; 6 was slower).
  static constexpr int kMaxNT = E == 0 ? 8 : 7;

  template <int NT = kMaxNT>
  void tail(int64_t n, int64_t b, int64_t t0) const {
    if constexpr (NT > 1)
      if (n < NT) return tail<NT - 1>(n, b, t0);
    tile<NT>(b, t0);
  }

  void run(int64_t nb) const {
    for (int64_t b = 0; b < nb; b += kNB)
      for (int64_t t0 = 0; t0 < a.T; t0 += kMaxNT) tail(std::min<int64_t>(kMaxNT, a.T - t0), b, t0);
  }
};

template <class Rows>
void expand(const Weight& w, const Plan& pl, Rows& rows, int64_t ra, int64_t rz, Expanded& ex) {
  const int64_t kp = w.kp, nb = blocks_for(ra, rz), len = kp / pl.periods;
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t r = ra + b * kRowBlock16;
    int8_t* blk = ex.blocks.data() + b * kRowBlock16 * kp;
    if (w.fmt == Fmt::I8_R16 && r < rz)
      std::memcpy(blk, r16_block(w, r / kRowBlock16), size_t(kRowBlock16 * kp));
    else if (r < rz)
      expand_block(w, rows, r, rz, blk);
    else
      std::memset(blk, 0, size_t(kRowBlock16 * kp));
    // Rows past rz have zero weights (I8_R16 pads its last block with zero rows) and scales;
    // w.scale is (rows, groups), groups == 1 for per-row scales.
    float* sc = ex.scale.data() + b * pl.groups * 16;
    for (int64_t i = 0; i < kRowBlock16; ++i)
      for (int64_t g = 0; g < pl.groups; ++g)
        sc[g * 16 + i] = r + i < rz ? w.scale[(r + i) * pl.groups + g] : 0.f;
    // -128 * the 16 rows' sums per period: vpdpbusd of the values with bytes of 1.
    for (int64_t p = 0; p < pl.periods; ++p) {
      __m512i s = _mm512_setzero_si512();
      for (int64_t k = p * len; k < (p + 1) * len; k += 4)
        s = _mm512_dpbusd_epi32(s, _mm512_set1_epi8(1), _mm512_load_si512(blk + 16 * k));
      _mm512_store_si512(ex.start.data() + (b * pl.periods + p) * 16,
                         _mm512_mullo_epi32(s, _mm512_set1_epi32(-128)));
    }
  }
}

template <int E, Scales S, class Rows>
void gemm_rows(const Weight& w, const GemmActs& a, float* y, int64_t ldy, int64_t r0, int64_t r1,
               Rows& rows, Expanded& ex) {
  const int64_t kp = w.kp;
  const Plan pl{kp, E ? kp / E : 1, scale_groups(w)};
  for (int64_t ra = r0; ra < r1; ra += kExpandRows) {
    const int64_t rz = std::min(r1, ra + kExpandRows);
    expand(w, pl, rows, ra, rz, ex);
    Kernel<E, S>{pl, ex, a, y, ldy, ra, rz}.run(blocks_for(ra, rz));
  }
}

template <class Rows>
void gemm_format(const Weight& w, const GemmActs& a, float* y, int64_t ldy, int64_t r0,
                 int64_t r1, Rows&& rows, Expanded& ex) {
  const int64_t period = dot_period(w);
  if (!period) return gemm_rows<0, Scales::kRowToken>(w, a, y, ldy, r0, r1, rows, ex);
  with_group(int(period), [&](auto g) {
    constexpr int E = decltype(g)::value;
    if (scale_groups(w) == 1)  // weight-only int8: per-row scales
      return gemm_rows<E, Scales::kRowGroup>(w, a, y, ldy, r0, r1, rows, ex);
    w.act_int8 ? gemm_rows<E, Scales::kGroupToken>(w, a, y, ldy, r0, r1, rows, ex)
               : gemm_rows<E, Scales::kGroupGroup>(w, a, y, ldy, r0, r1, rows, ex);
  });
}

}  // namespace

void int8_gemm(const Weight& w, const GemmActs& a, float* y, int64_t ldy, int64_t r0,
               int64_t r1) {
  thread_local Expanded ex;
  const int64_t kp = w.kp, nb = kExpandRows / kRowBlock16;
  const int64_t periods = kp / 32, groups = scale_groups(w);
  if (int64_t(ex.blocks.size()) < nb * kRowBlock16 * kp) ex.blocks.resize(size_t(nb * kRowBlock16 * kp));
  if (int64_t(ex.start.size()) < nb * periods * 16) ex.start.resize(size_t(nb * periods * 16));
  if (int64_t(ex.scale.size()) < nb * groups * 16) ex.scale.resize(size_t(nb * groups * 16));
  switch (w.fmt) {
    case Fmt::I8_R16: return gemm_format(w, a, y, ldy, r0, r1, NoRows{}, ex);
    case Fmt::I8: return gemm_format(w, a, y, ldy, r0, r1, I8Rows{w, {}}, ex);
    case Fmt::SP_I8: return gemm_format(w, a, y, ldy, r0, r1, SpI8Rows{{w}}, ex);
    case Fmt::SP_I4: return gemm_format(w, a, y, ldy, r0, r1, SpI4Rows{{w}}, ex);
    case Fmt::I4:
      return with_group(w.group, [&](auto g) {
        gemm_format(w, a, y, ldy, r0, r1, I4Rows<decltype(g)::value>{w, {}, {}}, ex);
      });
    default: return gemm_format(w, a, y, ldy, r0, r1, S24Rows{w, {}, {}}, ex);  // S24_I8
  }
}

// quantize_int8_row's per-token int8 (compressed-tensors' grid, the same float operations: a
// correctly rounded division, round to nearest even, clamp), + 128, in one pass.
void quantize_row_u8(const float* x, int64_t n, uint8_t* xu, float* scale) {
  __m512 m = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
  *scale = _mm512_reduce_max_ps(m) / 127.5f;
  if (*scale == 0.f) {  // all zeros (or so tiny that the scale underflows)
    std::memset(xu, 128, size_t(n));
    return;
  }
  const __m512 s = _mm512_set1_ps(*scale);
  const __m512i lo = _mm512_set1_epi32(-128), hi = _mm512_set1_epi32(127);
  for (int64_t i = 0; i < n; i += 16) {
    const __m512i q = _mm512_min_epi32(
        _mm512_max_epi32(_mm512_cvtps_epi32(_mm512_div_ps(_mm512_loadu_ps(x + i), s)), lo), hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(xu + i),
                     _mm512_cvtepi32_epi8(_mm512_add_epi32(q, _mm512_set1_epi32(128))));
  }
}

// One row x (kp) -> xu = q + 128 and xs per `group` columns: q = rint(x * (127 / max|x|)),
// scale max|x| / 127 (0 and q = 0 for an all-zero group, or one whose 127 / max overflows).
void quantize_groups(const float* x, int64_t kp, int64_t group, uint8_t* xu, float* xs) {
  for (int64_t k = 0; k < kp; k += group) {
    __m512 m = _mm512_setzero_ps();
    for (int64_t i = k; i < k + group; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
    const float amax = _mm512_reduce_max_ps(m), inv = 127.f / amax;
    if (!(inv < INFINITY)) {  // amax 0 or subnormal
      std::memset(xu + k, 128, size_t(group));
      xs[k / group] = 0.f;
      continue;
    }
    xs[k / group] = amax / 127.f;
    for (int64_t i = k; i < k + group; i += 16)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(xu + i),
                       _mm512_cvtepi32_epi8(_mm512_add_epi32(
                           _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_set1_ps(inv))),
                           _mm512_set1_epi32(128))));
  }
}

}  // namespace sl::avx512
