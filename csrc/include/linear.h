// y = x @ W.T for any packed weight format: activation preparation, then either the multi-token
// GEMV (T <= gemv_max_tokens(): decode, batched decode, speculative verification) or the
// decoded-panel GEMM (prefill), parallel over output rows.
#pragma once

#include <vector>

#include "aligned.h"
#include "weight.h"

namespace sl {

// Work buffers of linear(), grown by reserve() and never shrunk: the model reserves its
// largest shapes once at build time so a decode step allocates nothing.
struct LinearScratch {
  AlignedVector<float> xpad;    // (T, kp) activations, zero padded (fake-quantized for the
                                // portable W8A8 GEMM; AVX2's: their int8 codes as floats)
  AlignedVector<int8_t> xq;     // (T, kp) int8 activations (W8A8 GEMV, AVX2 int4 GEMM)
  AlignedVector<float> xscale;  // (T,) per-token activation scales
  AlignedVector<int32_t> xsum;  // (T,) per-token sums of xq (the AVX-512 W8A8 kernels' offset)
  AlignedVector<float> gsum;    // (kMaxMulti, T, kp/32) per-weight, per-token int4 group sums
                                // (the AVX2 int4 GEMM: (T, kp/32), of xq per 32 columns)
  AlignedVector<uint8_t> xu;    // (T, kp) int8 GEMM activations + 128 (GemmActs, AVX-512)
  AlignedVector<int16_t> xw;    // (T, kp) int16 GEMM activations (GemmActs, AVX2)
  AlignedVector<float> xgscale; // (T, kp/32) their scales per group (weight-only formats);
                                // group_int8's GEMV: (kMaxMulti, T, kp/32), sized on first use
  AlignedVector<int8_t> xgq;    // (kMaxMulti, T, kp) its codes (sized on first use)
  AlignedVector<float> xt;      // x k-major in token tiles (transpose_tokens; sized on first use)
  // A prompt chunk: above the GEMV's limit, weight-only int4 may quantize activations for the
  // integer GEMM. Off (batched decode, speculative verification), it takes the fp32 GEMM
  // (under group_int8 below: the GEMV or the integer GEMM on the GEMV's codes), whose results
  // differ from the GEMV's by rounding only, so verified tokens are the ones decode would pick.
  bool prompt = false;
  // Weight-only formats with a GEMV on x quantized per group of columns (Gemv::group_int8,
  // AVX2: dense int4 per weight group, int8 per 32 columns) quantize it for decode and
  // speculative verification too, as llama.cpp and OpenVINO do. Above the GEMV's limit int4
  // takes the integer GEMM on the same codes (results differing from the GEMV's by rounding
  // only, as for W4A8); int8 keeps the fp32 GEMM of its prompts.
  bool group_int8 = false;
  void reserve(int64_t T, int64_t kp);
};

constexpr int64_t kPanelRows = 48;  // AVX-512 GEMM: 3 vectors of 16 rows; AVX2: 16 x 3 rows
constexpr int kMaxMulti = 4;        // most weights linear_multi fuses into one pass

// Up to gemv_max_tokens(w) tokens, linear() streams each packed weight once and computes every
// token's row like T == 1 does (bitwise equal results per token, int32-exact for W8A8); above
// it a GEMM runs (faster per token for prefill, but rounding differs): the integer GEMM of
// the int8-activation formats on AVX2 (W8A8: exact fp32 FMAs on the codes; int4: int8) and
// AVX-512 (int8), and in
// a prompt (LinearScratch::prompt) of weight-only int4 (AVX2, AVX-512) and int8 (AVX-512), which
// keeps W8A8's GEMV bits (kernels.h GemmActs), otherwise weight panels decoded to fp32 once. The
// limit is the format's, per activation type (kFmtTraits); set_gemv_max_tokens(n > 0)
// overrides it for measurements, 0 restores the defaults.
int64_t gemv_max_tokens(const Weight& w);
// Under LinearScratch::group_int8 on the active ISA: the columns per activation scale of this
// weight's GEMV (where it has a Gemv::group_int8 kernel: int4's group, int8's 32), else -1.
int64_t group_int8_act_group(const Weight& w);
void set_gemv_max_tokens(int64_t n);

// x: (T, w.cols) with row stride ldx; y: (T, w.rows) with row stride ldy.
void linear(const Weight& w, const float* x, int64_t T, int64_t ldx, float* y, int64_t ldy,
            LinearScratch& s);

// Several weights of the same input width applied to the same x (q/k/v, gate/up): on the GEMV
// path one parallel region streams all of them (one fork/join instead of n, activations
// prepared once); on the GEMM path it is n linear() calls. ys[i]: (T, ws[i]->rows) with row
// stride ws[i]->rows. n <= kMaxMulti.
void linear_multi(const Weight* const* ws, float* const* ys, int n, const float* x, int64_t T,
                  int64_t ldx, LinearScratch& s);

}  // namespace sl
