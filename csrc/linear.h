// y = x @ W.T for any packed weight format: activation preparation + GEMV (T == 1) or
// decoded-panel GEMM (T > 1), parallel over output rows.
#pragma once

#include <vector>

#include "common.h"

namespace sl {

// Work buffers of linear(), grown by reserve() and never shrunk: the model reserves its
// largest shapes once at build time so a decode step allocates nothing.
struct LinearScratch {
  std::vector<float> xpad;    // (T, kp) activations, zero padded (fake-quantized for W8A8 GEMM)
  std::vector<int8_t> xq;     // (T, kp) int8 activations for W8A8 GEMV
  std::vector<float> xscale;  // (T,) per-token activation scales
  std::vector<float> gsum;    // (T, kp/32) per-group sums of x for int4 zero points
  std::vector<float> panel;   // (threads, kPanelRows, kp) decoded weight rows
  void reserve(int64_t T, int64_t kp);
};

constexpr int64_t kPanelRows = 24;  // multiple of the GEMM micro-kernel's 3 rows

// x: (T, w.cols) with row stride ldx; y: (T, w.rows) with row stride ldy.
void linear(const Weight& w, const float* x, int64_t T, int64_t ldx, float* y, int64_t ldy,
            LinearScratch& s);

// Several weights of the same input width applied to the same x (q/k/v, gate/up): for T == 1
// one parallel region streams all of them (one fork/join instead of n); for T > 1 it is n
// linear() calls. ys[i]: (T, ws[i]->rows) with row stride ws[i]->rows.
void linear_multi(const Weight* const* ws, float* const* ys, int n, const float* x, int64_t T,
                  int64_t ldx, LinearScratch& s);

}  // namespace sl
