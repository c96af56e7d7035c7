// The kernels' arguments (Acts, GemmActs, PanelRows) and entry points. Every kernel family
// lives in kernels/scalar/<family>.cpp (portable scalar reference) and in
// kernels/avx2/<family>.cpp / kernels/avx512/<family>.cpp (compiled with that folder's ISA flags
// and only called after the run-time CPU check in runtime/cpu.cpp).
#pragma once

#include <cstdint>

#include "weight.h"

namespace sl {

// Activations of a small batch of T tokens handed to the kernels. Every row is padded to kp
// (zeros), so row t of x / xq starts at t * kp; one kernel call multiplies each weight row it
// owns with all T tokens, reading the packed row from DRAM once (decode: T == 1; batched decode
// and speculative verification: a few tokens).
struct Acts {
  int64_t T = 1;
  const float* x = nullptr;       // (T, kp) fp32
  const int8_t* xq = nullptr;     // (T, kp) int8, act_int8 formats only
  const float* xscale = nullptr;  // (T,) x[t] ~= xq[t] * xscale[t]
  const int32_t* xsum = nullptr;  // (T,) sum of xq[t], act_int8 formats only
  const int16_t* xw = nullptr;    // (T, kp) xq widened to int16, for Gemv::int16_codes kernels
  const float* xgscale = nullptr; // (T, kp/group) xq's scales per weight group (Gemv::group_int8)
  const float* gsum = nullptr;    // (T, kp/group) I4, and SP_I4 W4A8 on AVX-512: per-group
                                  // sums of x (xq for W4A8)
};

// Activations of the integer GEMMs of prefill (AVX-512 int8; AVX2: W8A8 exact in fp32, int4
// int8): x's int8 codes, (T, kp), and their scales, per token (W8A8, W4A8: the GEMV's xq /
// xscale) or per group of columns, (T, kp / group) (weight-only formats: quantized for the GEMM
// alone, int_gemm_act_group).
struct GemmActs {
  int64_t T = 0;
  const uint8_t* xu = nullptr;   // AVX-512: codes + 128
  const float* xf = nullptr;     // AVX2 W8A8 (panel_gemm_codes): the codes as floats
  const int8_t* xq = nullptr;    // AVX2 int4 kernel: the codes
  const float* gsum = nullptr;   // AVX2 int4 kernel: (T, kp / 32) sums of the codes
  const float* xs = nullptr;
};
// Columns per activation scale of the integer GEMM on the active ISA: 0 for W8A8 / W4A8 (per
// token), else a weight-only prompt's x quantized per group (AVX-512: int4 the weight's group,
// int8 32, a Q8_0 block; AVX2: dense int4 only, its weight's group); -1 where no integer GEMM
// runs: float weights, the portable path, the other weight-only formats on AVX2
// (runtime/linear.cpp).
int64_t int_gemm_act_group(const Weight& w);

// The rows [r0, r0 + nr) of w that a panel GEMM packs, as fp32: fp32 weights in place, any other
// format decoded (decode_rows) by the GEMM a group of rows at a time, into a buffer that stays in
// L2 while it packs them, rather than the whole 48-row panel first (up to 1 MB) read back from
// further away.
struct PanelRows {
  const Weight& w;
  int64_t r0, nr;
  // Rows r0 + i .. r0 + i + n (i + n <= nr) with stride w.kp: in place, or decoded into buf
  // (n * w.kp floats). Out of line (runtime/linear.cpp): portable code.
  const float* rows(int64_t i, int64_t n, float* buf) const;
};

// ---------------------------------------------------------------------------------------------
// Kernel entry points. gemv_*: y[t * ldy + r] = dot(W[r], x[t]) for rows r in [r0, r1) and all
// T tokens. Each token's result is bitwise the same whatever T and whichever other tokens share
// the call: every kernel walks a row in one fixed order and keeps separate accumulators per token
// (tiles.h), so batching sequences or verifying drafted tokens never changes a logit.
// decode_rows_<format>: dequantize rows [r0, r1) into out (r1-r0, kp) fp32 (GEMM panels,
// embedding lookups); portable, in kernels/scalar/gemv_sparse.cpp next to the bitmask / 2:4 walkers
// they share; their cost is amortized over T.
// ---------------------------------------------------------------------------------------------
#define SL_GEMV_KERNELS(X) \
  X(f32) X(f16) X(bf16) X(i8) X(i8a8) X(i4) X(i4a8) X(sp_f32) X(sp_i8) X(sp_i8a8) X(sp_i4) \
  X(sp_i4a8) X(s24_i8) X(s24_i8a8) X(i4k) X(i4ka8)
#define SL_DECODE_ROWS(X) \
  X(f32) X(f16) X(bf16) X(i8) X(i8_r16) X(i4) X(sp_f32) X(sp_i8) X(sp_i4) X(s24_i8) X(i4k)
#define SL_DECLARE_GEMV(name) \
  void gemv_##name(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
#define SL_DECLARE_DECODE_ROWS(name) \
  void decode_rows_##name(const Weight& w, int64_t r0, int64_t r1, float* out);

namespace scalar {
SL_GEMV_KERNELS(SL_DECLARE_GEMV)
SL_DECODE_ROWS(SL_DECLARE_DECODE_ROWS)
// Y[t, r] = dot(W[r], X[t]) for a panel of W.nr <= kPanelRows rows and T tokens (k = W.w.kp).
void panel_gemm(const PanelRows& W, const float* X, int64_t ldx, int64_t T, float* Y,
                int64_t ldy);
void quantize_row(const float* x, int64_t n, int8_t* q, float* scale);
}  // namespace scalar

namespace avx2 {
SL_GEMV_KERNELS(SL_DECLARE_GEMV)
void panel_gemm(const PanelRows& W, const float* X, int64_t ldx, int64_t T, float* Y,
                int64_t ldy);
// W8A8 prefill (dense, bitmask, 2:4): the panel GEMM on the weights' integer codes (X: the int8
// codes of the activations as floats), exact int32 dots per row, then y = float(dot) *
// (xscale[t] * scale[r]): the GEMV's bits (kernels/avx2/gemm.cpp).
void panel_gemm_codes(const PanelRows& W, const float* X, int64_t ldx, int64_t T, float* Y,
                      int64_t ldy, const float* xscale);
void quantize_row(const float* x, int64_t n, int8_t* q, float* scale);
// The int4 GEMM of prefill (kernels/avx2/gemm_int.cpp), dense and bitmask: W4A8 and, in a
// prompt, weight-only int4: y[t * ldy + r] for rows [r0, r1), r0 a multiple of 16, from
// GemmActs::xq and gsum.
void int_gemm(const Weight& w, const GemmActs& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
// Its activations: quantize_row's codes per token (W4A8) or weight-only int4's per group
// (quantize_groups). widen_codes: int8 codes -> int16 (Acts::xw; n a multiple of 16).
void widen_codes(const int8_t* q, int64_t n, int16_t* xw);
void quantize_groups(const float* x, int64_t kp, int64_t group, int8_t* q, float* xs);
// Weight-only int4 on x quantized per weight group (xq, xgscale; gsum: each group's code sum
// times its scale): the W4A8 kernel with per-group activation scales (Gemv::group_int8).
void gemv_i4_xg(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
void gemv_i4k_xg(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
// Weight-only int8 on x quantized per 32 columns (Gemv::group_int8).
void gemv_i8_xg(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
void decode_rows_sp_f32(const Weight& w, int64_t r0, int64_t r1, float* out);
void decode_rows_sp_i8(const Weight& w, int64_t r0, int64_t r1, float* out);
void decode_rows_s24_i8(const Weight& w, int64_t r0, int64_t r1, float* out);
}  // namespace avx2

namespace avx512 {
void decode_rows_sp_f32(const Weight& w, int64_t r0, int64_t r1, float* out);
void decode_rows_sp_i8(const Weight& w, int64_t r0, int64_t r1, float* out);
// Weights widened to fp32 against fp32 activations (kernels/avx512/gemv_int8.cpp, gemv_sparse.cpp).
void gemv_i8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
void gemv_sp_i8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
void gemv_sp_f32(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
void gemv_s24_i8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
void panel_gemm(const PanelRows& W, const float* X, int64_t ldx, int64_t T, float* Y,
                int64_t ldy);
void gemv_i4(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
void gemv_i4a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
void gemv_i8a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
void gemv_sp_i8a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
void gemv_s24_i8a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
void gemv_sp_i4(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
void gemv_sp_i4a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
// The bitmask fp32 GEMM of prefill (kernels/avx512/gemm_sparse.cpp), kept weights only:
// transpose_tokens lays x (T, kp) out k-major in tiles of kSparseTile tokens, xt
// (ceil(T / kSparseTile), kp, kSparseTile), lanes past T zero; sp_f32_gemm computes
// y[t * ldy + r] for rows [r0, r1) from it.
constexpr int64_t kSparseTile = 128;
void transpose_tokens(const float* x, int64_t T, int64_t kp, float* xt);
void sp_f32_gemm(const Weight& w, const float* xt, int64_t T, float* y, int64_t ldy, int64_t r0,
                 int64_t r1);
// The int8 GEMM of prefill (kernels/avx512/gemm_int.cpp) for every integer format (weight-only ones
// for prompts): y[t * ldy + r] for rows [r0, r1), r0 a multiple of 32.
void int8_gemm(const Weight& w, const GemmActs& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
// Weight-only formats' activations for it, per int_gemm_act_group columns.
void quantize_groups(const float* x, int64_t kp, int64_t group, uint8_t* xu, float* xs);
// quantize_int8_row's codes + 128 (W8A8 / W4A8 activations for it); n a multiple of 16.
void quantize_row_u8(const float* x, int64_t n, uint8_t* xu, float* scale);
}  // namespace avx512

}  // namespace sl
