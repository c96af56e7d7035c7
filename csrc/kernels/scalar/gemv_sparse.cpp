// Sparse GEMV, portable scalar reference.
//
// Unstructured ("bitmask") layout, the compressed-tensors sparse-bitmask idea made streamable:
//   mask    (rows, kp/8) uint8   bit j of byte b <-> column 8b + j is kept
//   values  flat, row r's kept values in column order starting at row_off[r]
// A GEMV walks one row's mask and values front to back, so the bytes read per token are exactly
// the packed bytes (values + 1 bit per column). Values are fp32, int8 (+ per-row scale) or
// signed int4 nibbles (+ per-group scale; row_off counts bytes). The int4 nibbles of each
// 64-column mask word start on a byte (a word with an odd count ends with an unused nibble), so
// SIMD kernels widen a word's bytes without first shifting the stream by a nibble.
//
// 2:4 layout (S24_I8): every 4 columns keep (at most) 2 values, so a 64-column block holds
// exactly 32 int8 values plus one uint64 of 2-bit in-group selectors. The order inside a block
// is chosen for the AVX2 kernel (which gathers x with pshufb instead of expanding weights):
//   chunk c = columns [16c, 16c+16); slot s holds chunk kSlotChunk[s] = {0, 2, 1, 3}[s];
//   value 8s+b of the block is the b-th kept value of that chunk, at column
//   16c + 4*(b/2) + sel, sel = (meta >> (8b + 2s)) & 3 (s24_selector_bit, s24_group_column).

#include "formats.h"
#include "half.h"
#include "kernels.h"
#include "kernels/tiles.h"

namespace sl::scalar {


template <typename V, typename F>
static inline void walk_bitmask_row(const uint8_t* mrow, int64_t kp, const V* vals, F&& f) {
  int64_t p = 0;
  for (int64_t b = 0; b < kp / 8; ++b)
    for (uint32_t m = mrow[b]; m; m &= m - 1) f(8 * b + __builtin_ctz(m), vals[p++]);
}

// Bitmask rows with per-row scale: V is float or int8_t, Acc float (fp32 activations) or int32_t
// (W8A8, exact integer dot); one walk of the row feeds every token of the tile.
template <typename V, typename Acc, typename X>
static void gemv_bitmask(const Weight& w, const Acts& a, const X* xs, float* y, int64_t ldy,
                         int64_t r0, int64_t r1) {
  const V* vals = static_cast<const V*>(w.data);
  const int64_t kp = w.kp;
  for_rows_and_tiles<4>(r0, r1, a.T, [&](auto nt, int64_t r, int64_t t0) {
    constexpr int NT = decltype(nt)::value;
    Acc acc[NT] = {};
    walk_bitmask_row(w.mask + r * (kp / 8), kp, vals + w.row_off[r], [&](int64_t k, V v) {
      for (int t = 0; t < NT; ++t) acc[t] += Acc(v) * Acc(xs[(t0 + t) * kp + k]);
    });
    for (int t = 0; t < NT; ++t) {
      const float s = w.fmt == Fmt::SP_F32 ? 1.f : w.scale[r];
      y[(t0 + t) * ldy + r] = w.act_int8 ? float(acc[t]) * (a.xscale[t0 + t] * s)
                                         : float(acc[t]) * s;
    }
  });
}

void gemv_sp_f32(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  gemv_bitmask<float, float>(w, a, a.x, y, ldy, r0, r1);
}

void gemv_sp_i8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  gemv_bitmask<int8_t, float>(w, a, a.x, y, ldy, r0, r1);
}

void gemv_sp_i8a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  gemv_bitmask<int8_t, int32_t>(w, a, a.xq, y, ldy, r0, r1);
}

static inline int32_t nibble_at(const uint8_t* bytes, int64_t i) {
  const int32_t n = (bytes[i >> 1] >> ((i & 1) * 4)) & 15;
  return (n ^ 8) - 8;  // sign-extend the two's complement nibble
}

// Bitmask int4 rows, fp32 activations (X = float) or int8 ones (W4A8: X = int8_t, exact int32
// dot per group, scaled by the token's xscale at the end).
template <typename X, typename Dot>
static void gemv_sp_i4_rows(const Weight& w, const Acts& a, const X* xs, float* y, int64_t ldy,
                            int64_t r0, int64_t r1) {
  const uint8_t* V = static_cast<const uint8_t*>(w.data);
  const int64_t kp = w.kp, ng = kp / w.group;
  for_rows_and_tiles<4>(r0, r1, a.T, [&](auto nt, int64_t r, int64_t t0) {
    constexpr int NT = decltype(nt)::value;
    const uint8_t* mrow = w.mask + r * (kp / 8);
    const uint8_t* vals = V + w.row_off[r];
    int64_t p = 0;
    float acc[NT] = {};
    for (int64_t g = 0; g < ng; ++g) {
      Dot dot[NT] = {};
      for (int64_t b = g * w.group / 8; b < (g + 1) * w.group / 8; ++b) {
        if (b % 8 == 0) p = sp_i4_word_start(p);
        for (uint32_t m = mrow[b]; m; m &= m - 1) {
          const Dot v = Dot(nibble_at(vals, p++));
          const int64_t col = 8 * b + __builtin_ctz(m);
          for (int t = 0; t < NT; ++t) dot[t] += v * Dot(xs[(t0 + t) * kp + col]);
        }
      }
      for (int t = 0; t < NT; ++t) acc[t] += float(dot[t]) * w.scale[r * ng + g];
    }
    for (int t = 0; t < NT; ++t)
      y[(t0 + t) * ldy + r] = w.act_int8 ? acc[t] * a.xscale[t0 + t] : acc[t];
  });
}

void gemv_sp_i4(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  gemv_sp_i4_rows<float, float>(w, a, a.x, y, ldy, r0, r1);
}

void gemv_sp_i4a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  gemv_sp_i4_rows<int8_t, int32_t>(w, a, a.xq, y, ldy, r0, r1);
}

// Calls f(column, value_index_in_block) for the 32 kept slots of a 2:4 block.
template <typename F>
static inline void walk_s24_block(uint64_t meta, F&& f) {
  for (int i = 0; i < 32; ++i)
    f(s24_group_column(i) + (int(meta >> s24_selector_bit(i)) & 3), i);
}

// 2:4 int8 rows; X / Acc as in gemv_bitmask.
template <typename Acc, typename X>
static void gemv_s24(const Weight& w, const Acts& a, const X* xs, float* y, int64_t ldy,
                     int64_t r0, int64_t r1) {
  const int8_t* V = static_cast<const int8_t*>(w.data);
  const int64_t kp = w.kp, nb = kp / 64;
  for_rows_and_tiles<4>(r0, r1, a.T, [&](auto nt, int64_t r, int64_t t0) {
    constexpr int NT = decltype(nt)::value;
    Acc acc[NT] = {};
    for (int64_t blk = 0; blk < nb; ++blk) {
      const int8_t* v = V + r * (kp / 2) + blk * 32;
      walk_s24_block(w.meta[r * nb + blk], [&](int col, int i) {
        for (int t = 0; t < NT; ++t) acc[t] += Acc(v[i]) * Acc(xs[(t0 + t) * kp + blk * 64 + col]);
      });
    }
    for (int t = 0; t < NT; ++t)
      y[(t0 + t) * ldy + r] = w.act_int8 ? float(acc[t]) * (a.xscale[t0 + t] * w.scale[r])
                                         : float(acc[t]) * w.scale[r];
  });
}

void gemv_s24_i8a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0,
                   int64_t r1) {
  gemv_s24<int32_t>(w, a, a.xq, y, ldy, r0, r1);
}

void gemv_s24_i8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  gemv_s24<float>(w, a, a.x, y, ldy, r0, r1);
}

// Row decoders, one per format (kFmtTraits' decode_rows): dequantize rows [r0, r1) into out
// (r1-r0, kp). The GEMM path decodes a panel once and reuses it for every token, so this cost is
// amortized over T.
template <typename F>
static void for_rows(const Weight& w, int64_t r0, int64_t r1, float* out, F&& row) {
  for (int64_t r = r0; r < r1; ++r) row(r, out + (r - r0) * w.kp);
}

void decode_rows_f32(const Weight& w, int64_t r0, int64_t r1, float* out) {
  for_rows(w, r0, r1, out, [&](int64_t r, float* o) {
    const float* W = static_cast<const float*>(w.data) + r * w.kp;
    for (int64_t k = 0; k < w.kp; ++k) o[k] = W[k];
  });
}

void decode_rows_f16(const Weight& w, int64_t r0, int64_t r1, float* out) {
  for_rows(w, r0, r1, out, [&](int64_t r, float* o) {
    const uint16_t* W = static_cast<const uint16_t*>(w.data) + r * w.kp;
    for (int64_t k = 0; k < w.kp; ++k) o[k] = half_to_float(W[k]);
  });
}

void decode_rows_bf16(const Weight& w, int64_t r0, int64_t r1, float* out) {
  for_rows(w, r0, r1, out, [&](int64_t r, float* o) {
    const uint16_t* W = static_cast<const uint16_t*>(w.data) + r * w.kp;
    for (int64_t k = 0; k < w.kp; ++k) o[k] = bf16_to_float(W[k]);
  });
}

void decode_rows_i8(const Weight& w, int64_t r0, int64_t r1, float* out) {
  for_rows(w, r0, r1, out, [&](int64_t r, float* o) {
    const int8_t* W = static_cast<const int8_t*>(w.data) + r * w.kp;
    const float s = w.scale[r];
    for (int64_t k = 0; k < w.kp; ++k) o[k] = float(W[k]) * s;
  });
}

void decode_rows_i8_r16(const Weight& w, int64_t r0, int64_t r1, float* out) {
  for_rows(w, r0, r1, out, [&](int64_t r, float* o) {
    const int8_t* row = r16_block(w, r / kRowBlock16) + 4 * (r % kRowBlock16);
    const float s = w.scale[r];
    for (int64_t k = 0; k < w.kp; ++k) o[k] = float(row[16 * (k & ~int64_t(3)) + (k & 3)]) * s;
  });
}

void decode_rows_i4(const Weight& w, int64_t r0, int64_t r1, float* out) {
  const int64_t kp = w.kp, ng = kp / w.group;
  for_rows(w, r0, r1, out, [&](int64_t r, float* o) {
    const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * (kp / 2);
    for (int64_t blk = 0; blk < kp / 32; ++blk) {
      const int64_t g = blk * 32 / w.group;
      const float s = w.scale[r * ng + g];
      const float z = w.asym ? float(w.zero[r * ng + g]) : 8.f;
      for (int j = 0; j < 16; ++j) {
        o[blk * 32 + j] = (float(row[blk * 16 + j] & 15) - z) * s;
        o[blk * 32 + j + 16] = (float(row[blk * 16 + j] >> 4) - z) * s;
      }
    }
  });
}

void decode_rows_i4k(const Weight& w, int64_t r0, int64_t r1, float* out) {
  for_rows(w, r0, r1, out, [&](int64_t r, float* o) {
    const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * (w.kp / 2);
    for (int64_t g = 0; g < w.kp / 32; ++g) {
      const float s = i4k_scale(w, r, g), m = i4k_min(w, r, g);
      for (int j = 0; j < 16; ++j) {
        o[g * 32 + j] = s * float(row[g * 16 + j] & 15) - m;
        o[g * 32 + j + 16] = s * float(row[g * 16 + j] >> 4) - m;
      }
    }
  });
}

void decode_rows_sp_f32(const Weight& w, int64_t r0, int64_t r1, float* out) {
  for_rows(w, r0, r1, out, [&](int64_t r, float* o) {
    for (int64_t k = 0; k < w.kp; ++k) o[k] = 0.f;
    walk_bitmask_row(w.mask + r * (w.kp / 8), w.kp,
                     static_cast<const float*>(w.data) + w.row_off[r],
                     [&](int64_t k, float v) { o[k] = v; });
  });
}

void decode_rows_sp_i8(const Weight& w, int64_t r0, int64_t r1, float* out) {
  for_rows(w, r0, r1, out, [&](int64_t r, float* o) {
    for (int64_t k = 0; k < w.kp; ++k) o[k] = 0.f;
    const float s = w.scale[r];
    walk_bitmask_row(w.mask + r * (w.kp / 8), w.kp,
                     static_cast<const int8_t*>(w.data) + w.row_off[r],
                     [&](int64_t k, int8_t v) { o[k] = float(v) * s; });
  });
}

void decode_rows_sp_i4(const Weight& w, int64_t r0, int64_t r1, float* out) {
  const int64_t kp = w.kp, ng = kp / w.group;
  for_rows(w, r0, r1, out, [&](int64_t r, float* o) {
    for (int64_t k = 0; k < kp; ++k) o[k] = 0.f;
    const uint8_t* mrow = w.mask + r * (kp / 8);
    const uint8_t* vals = static_cast<const uint8_t*>(w.data) + w.row_off[r];
    int64_t p = 0;
    for (int64_t b = 0; b < kp / 8; ++b) {
      if (b % 8 == 0) p = sp_i4_word_start(p);
      for (uint32_t m = mrow[b]; m; m &= m - 1) {
        const int64_t k = 8 * b + __builtin_ctz(m);
        o[k] = float(nibble_at(vals, p++)) * w.scale[r * ng + k / w.group];
      }
    }
  });
}

void decode_rows_s24_i8(const Weight& w, int64_t r0, int64_t r1, float* out) {
  const int64_t kp = w.kp, nb = kp / 64;
  for_rows(w, r0, r1, out, [&](int64_t r, float* o) {
    for (int64_t k = 0; k < kp; ++k) o[k] = 0.f;
    const float s = w.scale[r];
    for (int64_t blk = 0; blk < nb; ++blk) {
      const int8_t* v = static_cast<const int8_t*>(w.data) + r * (kp / 2) + blk * 32;
      walk_s24_block(w.meta[r * nb + blk],
                     [&](int col, int i) { o[blk * 64 + col] = float(v[i]) * s; });
    }
  });
}

}  // namespace sl::scalar
