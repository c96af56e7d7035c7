// Sparse GEMV, AVX2 (layouts documented in kernels/scalar/gemv_sparse.cpp).
//
// Bitmask formats expand the packed values back to dense columns in registers with shuffles
// whose controls come from 256-entry tables indexed by a mask byte; the value pointer then
// advances by popcount(mask byte). Weights are read once, in order. The integer-activation
// kernels (W8A8, W4A8) and W4A16 expand 16 columns at a time straight to int16
// (kernels/avx2/simd.h expand32_i16; int4 rows are unpacked to bytes first, unpack_sp_i4_row); the
// fp32 and W8A16 ones 8 columns to fp32. The expansion costs the same instructions whatever
// the density, so at T = 1 these kernels are compute-bound on AVX2: ~45 instructions per 32
// columns (bitmask W8A8), about half the dense int8 GEMV's weights per second per core. Variants
// that were no faster: BMI2 rotates and bzhi for the table offsets and popcounts, madd of the
// values left in the high byte (no shift) with the sums shifted once per 2048 columns, a
// 128-bit broadcast of the values with the second lane's control offset by a table add,
// software prefetch from DRAM, and int8 expansion (16 columns per 128-bit pshufb) with the
// vpmaddubsw sign trick (which would also need x's -128 codes handled apart). An in-register
// control computation (nibble popcounts + prefix sums, no table lookups) was slower: it moves
// the work onto the two shuffle ports. So was, for one token, packing its codes to each row's
// kept columns (a shuffle and an 8-byte store per mask byte at a running offset, a row ahead)
// and multiplying only the kept values: 0.75x on Zen 1 (the packing loop has as many
// instructions per column as the expansion; with 16-byte stores, 0.47x). AVX-512 VBMI2's
// vpexpandb does the expansion in one instruction.
//
// The 2:4 format instead gathers the activations: 2-bit selectors become a pshufb control in
// 4 instructions per 64 columns and the 32 packed weights are used as they are.
#include <immintrin.h>

#include "aligned.h"
#include "kernels/codegen.h"
#include "kernels.h"
#include "kernels/avx2/simd.h"

namespace sl::avx2 {

// fp32-activation bitmask rows (SP_F32, SP_I8 W8A16): expand8(v, m) (expand8_f32, expand8_i8
// below) makes 8 dense fp32 weights from the packed values at v for mask byte m. Each expansion
// feeds every token of the tile; 2 accumulators per token (even / odd mask bytes), 4 tokens per
// tile. The 4 mask bytes of a step find their values by prefix popcounts, not by a pointer
// advanced per byte (a chain of dependent adds).
template <typename V, typename Expand8, typename RowScale>
static inline void bitmask_float_rows(const Weight& w, const Acts& a, float* y, int64_t ldy,
                                      int64_t r0, int64_t r1, Expand8 expand8,
                                      RowScale row_scale) {
  static_assert(inlined_callables<Expand8, RowScale>, "pass closure objects (kernels/codegen.h)");
  const V* vals = static_cast<const V*>(w.data);
  const int64_t kp = w.kp;
  for_rows_and_tiles<4>(r0, r1, a.T, [&](auto nt, int64_t r, int64_t t0) {
    constexpr int NT = decltype(nt)::value;
    const uint8_t* mrow = w.mask + r * (kp / 8);
    const V* v = vals + w.row_off[r];
    const float* x = a.x + t0 * kp;
    __m256 acc[NT][2];
    for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (int64_t c = 0; c < kp / 8; c += 4) {
      const uint32_t m4 = load_u32(mrow + c);
      const int off[4] = {0, __builtin_popcount(m4 & 0xff), __builtin_popcount(m4 & 0xffff),
                          __builtin_popcount(m4 & 0xffffff)};
      for (int j = 0; j < 4; ++j) {
        const __m256 e = expand8(v + off[j], (m4 >> (8 * j)) & 255);
        for (int t = 0; t < NT; ++t)
          acc[t][j & 1] = _mm256_fmadd_ps(e, _mm256_loadu_ps(x + t * kp + 8 * (c + j)), acc[t][j & 1]);
      }
      v += __builtin_popcount(m4);
    }
    const float sc = row_scale(r);
    for (int t = 0; t < NT; ++t)
      y[(t0 + t) * ldy + r] = hsum(_mm256_add_ps(acc[t][0], acc[t][1])) * sc;
  });
}

// 8 dense columns from the packed values at v for mask byte m, as fp32 (int8: unscaled). Closure
// objects (inlined_callables, kernels/codegen.h).
constexpr auto expand8_f32 = [](const float* v, uint32_t m) {
  return _mm256_and_ps(
      _mm256_permutevar8x32_ps(_mm256_loadu_ps(v),
                               _mm256_load_si256(reinterpret_cast<const __m256i*>(kT.perm[m]))),
      _mm256_load_ps(reinterpret_cast<const float*>(kT.keep[m])));
};
constexpr auto expand8_i8 = [](const int8_t* v, uint32_t m) {
  const __m128i e = _mm_shuffle_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(v)),
                                     shuf_ctrl8(m, 0));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e));
};

void gemv_sp_f32(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  bitmask_float_rows<float>(w, a, y, ldy, r0, r1, expand8_f32, unit_scale);
}

void gemv_sp_i8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  bitmask_float_rows<int8_t>(w, a, y, ldy, r0, r1, expand8_i8,
                             [&w](int64_t r) { return w.scale[r]; });
}

// Row decoders of the fp32 panels (prompts of bitmask fp32 and weight-only int8): 8 columns per
// mask byte by the GEMVs' expansions, times the row's scale (exact for fp32's 1): the scalar
// decoders' values (one kept weight at a time was a noticeable part of the GEMM over the panel).
template <typename V, typename Expand8, typename RowScale>
static void decode_bitmask_rows(const Weight& w, int64_t r0, int64_t r1, float* out,
                                Expand8 expand8, RowScale row_scale) {
  static_assert(inlined_callables<Expand8, RowScale>, "pass closure objects (kernels/codegen.h)");
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* mrow = w.mask + r * (w.kp / 8);
    const V* v = static_cast<const V*>(w.data) + w.row_off[r];
    const __m256 s = _mm256_set1_ps(row_scale(r));
    float* o = out + (r - r0) * w.kp;
    for (int64_t c = 0; c < w.kp / 8; ++c) {
      const uint32_t m = mrow[c];
      _mm256_storeu_ps(o + 8 * c, _mm256_mul_ps(expand8(v, m), s));
      v += __builtin_popcount(m);
    }
  }
}

void decode_rows_sp_f32(const Weight& w, int64_t r0, int64_t r1, float* out) {
  decode_bitmask_rows<float>(w, r0, r1, out, expand8_f32, unit_scale);
}

void decode_rows_sp_i8(const Weight& w, int64_t r0, int64_t r1, float* out) {
  decode_bitmask_rows<int8_t>(w, r0, r1, out, expand8_i8, [&w](int64_t r) { return w.scale[r]; });
}

// 2:4 rows: each 64-column block expanded to its dense int8 columns (expand_s24_block), then
// widened and scaled 8 at a time.
void decode_rows_s24_i8(const Weight& w, int64_t r0, int64_t r1, float* out) {
  const int64_t kp = w.kp, nb = kp / 64;
  for (int64_t r = r0; r < r1; ++r) {
    const int8_t* v = static_cast<const int8_t*>(w.data) + r * (kp / 2);
    const __m256 s = _mm256_set1_ps(w.scale[r]);
    float* o = out + (r - r0) * kp;
    for (int64_t b = 0; b < nb; ++b) {
      alignas(32) int8_t cols[64];
      expand_s24_block(v + 32 * b, w.meta[r * nb + b], cols);
      for (int j = 0; j < 8; ++j) {
        const __m256i q = _mm256_cvtepi8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(cols + 8 * j)));
        _mm256_storeu_ps(o + 64 * b + 8 * j, _mm256_mul_ps(_mm256_cvtepi32_ps(q), s));
      }
    }
  }
}

// W8A8 bitmask: 32 columns at a time expanded to int16 (expand32_i16) and multiplied with each
// token's int16 codes (Acts::xw, widened once per call) by two madds. 8 tokens per tile, so
// T <= 8 expands each row once.
void gemv_sp_i8a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const int8_t* V = static_cast<const int8_t*>(w.data);
  const int64_t kp = w.kp;
  for_rows_and_tiles<8>(r0, r1, a.T, [&](auto nt, int64_t r, int64_t t0) {
    constexpr int NT = decltype(nt)::value;
    const uint8_t* mrow = w.mask + r * (kp / 8);
    const int8_t* v = V + w.row_off[r];
    const int16_t* xw = a.xw + t0 * kp;
    __m256i acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_si256();
    for (int64_t c = 0; c < kp / 8; c += 4) {  // 32 columns per step
      const I16x32 wv = expand32_i16(v, load_u32(mrow + c));
      for (int t = 0; t < NT; ++t) acc[t] = dot_i16(acc[t], wv, xw + t * kp + 8 * c);
    }
    for (int t = 0; t < NT; ++t)
      y[(t0 + t) * ldy + r] = float(hsum_i32(acc[t])) * (a.xscale[t0 + t] * w.scale[r]);
  });
}

// Bitmask int4 rows: each row's nibbles become bytes first (unpack_sp_i4_row), then 32
// columns at a time expand as bitmask int8's do. Rows are unpacked one ahead into two
// per-thread buffers, so the row being multiplied was written a row earlier: expansion loads
// overlapping stores still in flight cannot take their data from them and wait until they
// retire. The group ends are counted down in one flat loop over the row (faster than a nested
// group loop at group 32).
class SpI4RowPipe {
 public:
  explicit SpI4RowPipe(const Weight& w) : w_(w) {
    thread_local AlignedVector<int8_t> buf;
    stride_ = sp_i4_row_bytes(w);
    if (buf.size() < size_t(2 * stride_)) buf.resize(size_t(2 * stride_));
    buf_ = buf.data();
  }
  // Row r's values as bytes (unpacked now if not held), after unpacking row r + 1.
  const int8_t* row(int64_t r) {
    if (held_[r & 1] != r) unpack(r);
    if (r + 1 < w_.rows && held_[(r + 1) & 1] != r + 1) unpack(r + 1);
    return buf_ + (r & 1) * stride_;
  }

 private:
  void unpack(int64_t r) {
    unpack_sp_i4_row(w_, r, buf_ + (r & 1) * stride_);
    held_[r & 1] = r;
  }
  const Weight& w_;
  int8_t* buf_;
  int64_t stride_;
  int64_t held_[2] = {-1, -1};
};

// W4A16: the expanded int16 values widen to fp32 (8 columns per vector) against the tokens'
// fp32 activations; two fp32 accumulators per token and group (even / odd 8 columns), scaled at
// the group's end. 3 tokens per tile: 3 x (acc, ga, gb) + the four widened weight vectors.
void gemv_sp_i4(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const int64_t kp = w.kp, ng = kp / w.group, steps_per_group = w.group / 32;
  SpI4RowPipe rows(w);
  for_rows_and_tiles<3>(r0, r1, a.T, [&](auto nt, int64_t r, int64_t t0) {
    constexpr int NT = decltype(nt)::value;
    const uint8_t* mrow = w.mask + r * (kp / 8);
    const int8_t* v = rows.row(r);
    const float* scale = w.scale + r * ng;
    __m256 acc[NT], ga[NT], gb[NT];
    for (int t = 0; t < NT; ++t) acc[t] = ga[t] = gb[t] = _mm256_setzero_ps();
    int64_t steps_left = steps_per_group;
    for (int64_t c = 0; c < kp / 8; c += 4) {  // 32 columns per step
      const I16x32 wv = expand32_i16<12>(v, load_u32(mrow + c));
      const __m256 f[4] = {
          _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(wv.lo))),
          _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(wv.lo, 1))),
          _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(wv.hi))),
          _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(wv.hi, 1)))};
      for (int t = 0; t < NT; ++t) {
        const float* x = a.x + (t0 + t) * kp + 8 * c;
        ga[t] = _mm256_fmadd_ps(f[0], _mm256_loadu_ps(x), ga[t]);
        gb[t] = _mm256_fmadd_ps(f[1], _mm256_loadu_ps(x + 8), gb[t]);
        ga[t] = _mm256_fmadd_ps(f[2], _mm256_loadu_ps(x + 16), ga[t]);
        gb[t] = _mm256_fmadd_ps(f[3], _mm256_loadu_ps(x + 24), gb[t]);
      }
      if (--steps_left == 0) {  // the group's end
        const __m256 s = _mm256_set1_ps(*scale++);
        steps_left = steps_per_group;
        for (int t = 0; t < NT; ++t) {
          acc[t] = _mm256_fmadd_ps(_mm256_add_ps(ga[t], gb[t]), s, acc[t]);
          ga[t] = gb[t] = _mm256_setzero_ps();
        }
      }
    }
    for (int t = 0; t < NT; ++t) y[(t0 + t) * ldy + r] = hsum(acc[t]);
  });
}

// W4A8: the expanded values times each token's int16 codes (Acts::xw) by two madds; one int32
// accumulator per token and group, scaled into fp32 at the group's end.
void gemv_sp_i4a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0,
                  int64_t r1) {
  const int64_t kp = w.kp, ng = kp / w.group, steps_per_group = w.group / 32;
  SpI4RowPipe rows(w);
  for_rows_and_tiles<8>(r0, r1, a.T, [&](auto nt, int64_t r, int64_t t0) {
    constexpr int NT = decltype(nt)::value;
    const uint8_t* mrow = w.mask + r * (kp / 8);
    const int8_t* v = rows.row(r);
    const int16_t* xw = a.xw + t0 * kp;
    const float* scale = w.scale + r * ng;
    __m256 acc[NT];
    __m256i gi[NT];  // the current group's exact dot products
    for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps(), gi[t] = _mm256_setzero_si256();
    int64_t steps_left = steps_per_group;
    for (int64_t c = 0; c < kp / 8; c += 4) {  // 32 columns per step
      const I16x32 wv = expand32_i16<12>(v, load_u32(mrow + c));
      for (int t = 0; t < NT; ++t) gi[t] = dot_i16(gi[t], wv, xw + t * kp + 8 * c);
      if (--steps_left == 0) {  // the group's end: scale into fp32
        const __m256 s = _mm256_set1_ps(*scale++);
        steps_left = steps_per_group;
        for (int t = 0; t < NT; ++t) {
          acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(gi[t]), s, acc[t]);
          gi[t] = _mm256_setzero_si256();
        }
      }
    }
    for (int t = 0; t < NT; ++t) y[(t0 + t) * ldy + r] = hsum(acc[t]) * a.xscale[t0 + t];
  });
}

void gemv_s24_i8a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0,
                   int64_t r1) {
  const int8_t* V = static_cast<const int8_t*>(w.data);
  const int64_t kp = w.kp, nb = kp / 64;
  // Per block the control and the weights are made once; each token gathers its own x.
  for_rows_and_tiles<4>(r0, r1, a.T, [&](auto nt, int64_t r, int64_t t0) {
    constexpr int NT = decltype(nt)::value;
    const int8_t* v = V + r * (kp / 2);
    const uint64_t* meta = w.meta + r * nb;
    __m256i acc[NT][2];
    for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_si256();
    for (int64_t blk = 0; blk < nb; ++blk) {
      const __m256i ctrl = s24_control(meta[blk]);
      const I16x32 wv =
          widen_i8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + blk * 32)));
      for (int t = 0; t < NT; ++t) {
        const int8_t* xq = a.xq + (t0 + t) * kp + blk * 64;
        const __m256i xa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
        const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32));
        // Slots 0/2 gather from chunks 0/1 (xa, low qwords), slots 1/3 from chunks 2/3 (xb).
        const __m256i xg = _mm256_blend_epi32(_mm256_shuffle_epi8(xa, ctrl),
                                              _mm256_shuffle_epi8(xb, ctrl), 0xcc);
        acc[t][blk & 1] = dot_i8(acc[t][blk & 1], wv, xg);
      }
    }
    for (int t = 0; t < NT; ++t)
      y[(t0 + t) * ldy + r] = float(hsum_i32(_mm256_add_epi32(acc[t][0], acc[t][1]))) *
                              (a.xscale[t0 + t] * w.scale[r]);
  });
}

void gemv_s24_i8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  // fp32 activations: gather x per slot with vpermps (which reads only the low 3 index bits,
  // so the chunk-relative control from s24_control works for both 8-column halves).
  const int8_t* V = static_cast<const int8_t*>(w.data);
  const int64_t kp = w.kp, nb = kp / 64;
  // 2 tokens per tile: 2 x 4 slot accumulators + the slot's index and weight vectors.
  for_rows_and_tiles<2>(r0, r1, a.T, [&](auto nt, int64_t r, int64_t t0) {
    constexpr int NT = decltype(nt)::value;
    const int8_t* v = V + r * (kp / 2);
    const uint64_t* meta = w.meta + r * nb;
    __m256 acc[NT][4];
    for (int t = 0; t < NT; ++t)
      for (int s = 0; s < 4; ++s) acc[t][s] = _mm256_setzero_ps();
    for (int64_t blk = 0; blk < nb; ++blk) {
      alignas(32) uint64_t ctrl[4];
      _mm256_store_si256(reinterpret_cast<__m256i*>(ctrl), s24_control(meta[blk]));
      for (int s = 0; s < 4; ++s) {
        const __m256i idx = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(ctrl[s])));
        const __m256 wf = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(v + blk * 32 + 8 * s))));
        for (int t = 0; t < NT; ++t) {
          const float* x = a.x + (t0 + t) * kp + blk * 64 + 16 * kSlotChunk[s];
          // values b = 0..3 live in columns 0..7 of the chunk, b = 4..7 in columns 8..15
          const __m256 xg = _mm256_blend_ps(_mm256_permutevar8x32_ps(_mm256_loadu_ps(x), idx),
                                            _mm256_permutevar8x32_ps(_mm256_loadu_ps(x + 8), idx),
                                            0xf0);
          acc[t][s] = _mm256_fmadd_ps(wf, xg, acc[t][s]);
        }
      }
    }
    for (int t = 0; t < NT; ++t)
      y[(t0 + t) * ldy + r] = hsum(_mm256_add_ps(_mm256_add_ps(acc[t][0], acc[t][1]),
                                                 _mm256_add_ps(acc[t][2], acc[t][3]))) *
                              w.scale[r];
  });
}

}  // namespace sl::avx2
