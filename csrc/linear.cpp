// Linear-layer driver shared by the Python `linear()` and NativeModel.
#include "linear.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace sl {

using GemvFn = void (*)(const Weight&, const Act&, float*, int64_t, int64_t);

static GemvFn pick_gemv(const Weight& w) {
  const bool v = use_avx2();
  switch (w.fmt) {
    case Fmt::F32: return v ? avx2::gemv_f32 : scalar::gemv_f32;
    case Fmt::F16: return v ? avx2::gemv_f16 : scalar::gemv_f16;
    case Fmt::BF16: return v ? avx2::gemv_bf16 : scalar::gemv_bf16;
    case Fmt::I8:
      if (w.act_int8) return v ? avx2::gemv_i8a8 : scalar::gemv_i8a8;
      return v ? avx2::gemv_i8 : scalar::gemv_i8;
    case Fmt::I4:
      if (w.act_int8) return v ? avx2::gemv_i4a8 : scalar::gemv_i4a8;
      return v ? avx2::gemv_i4 : scalar::gemv_i4;
    case Fmt::SP_F32: return v ? avx2::gemv_sp_f32 : scalar::gemv_sp_f32;
    case Fmt::SP_I8:
      if (w.act_int8) return v ? avx2::gemv_sp_i8a8 : scalar::gemv_sp_i8a8;
      return v ? avx2::gemv_sp_i8 : scalar::gemv_sp_i8;
    case Fmt::SP_I4: return v ? avx2::gemv_sp_i4 : scalar::gemv_sp_i4;
    case Fmt::S24_I8:
      if (w.act_int8) return v ? avx2::gemv_s24_i8a8 : scalar::gemv_s24_i8a8;
      return v ? avx2::gemv_s24_i8 : scalar::gemv_s24_i8;
  }
  throw std::logic_error("unknown weight format");
}

void LinearScratch::reserve(int64_t T, int64_t kp) {
  constexpr int64_t kMaxMulti = 4;  // linear_multi keeps one gsum row per weight
  auto grow = [](auto& v, size_t n) {
    if (v.size() < n) v.resize(n);
  };
  grow(xpad, size_t(T * kp));
  grow(xq, size_t(T * kp));
  grow(xscale, size_t(T));
  grow(gsum, size_t(std::max(T, kMaxMulti) * kp / 32));
  grow(panel, size_t(omp_get_max_threads() * kPanelRows * kp));
}

static void quantize(const float* x, int64_t n, int8_t* q, float* scale) {
  if (use_avx2()) avx2::quantize_row(x, n, q, scale); else scalar::quantize_row(x, n, q, scale);
}

// Below this many weight x token products a parallel region costs more than it saves (fork/join
// is microseconds, and much worse when the cores are oversubscribed), so run on one thread.
// (GEMM: 16x more, as its work per weight byte is compute, not a DRAM stream.)
constexpr int64_t kMinParallelWork = int64_t(1) << 16;

void linear(const Weight& w, const float* x, int64_t T, int64_t ldx, float* y, int64_t ldy,
            LinearScratch& s) {
  const int64_t kp = w.kp, K = w.cols;
  s.reserve(T, kp);  // no-op once sized

  // 1. Activations: zero-pad to kp (kernels have no tail loops), quantize for W8A8.
  float* xp = s.xpad.data();
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(xp + t * kp, x + t * ldx, size_t(K) * sizeof(float));
    std::fill(xp + t * kp + K, xp + (t + 1) * kp, 0.f);
  }
  if (w.act_int8) {
    for (int64_t t = 0; t < T; ++t) quantize(xp + t * kp, kp, s.xq.data() + t * kp, &s.xscale[t]);
  }

  if (T == 1) {
    // 2a. Decode: one pass over the weights; each thread streams one contiguous row range.
    Act a;
    a.x = xp;
    a.xq = s.xq.data();
    a.xscale = s.xscale[0];
    if (w.fmt == Fmt::I4) {
      // Group sums of the activations the kernel multiplies (zero-point term).
      for (int64_t g = 0; g < kp / w.group; ++g) {
        float acc = 0.f;
        for (int64_t k = g * w.group; k < (g + 1) * w.group; ++k)
          acc += w.act_int8 ? float(s.xq[k]) : xp[k];
        s.gsum[g] = acc;
      }
      a.gsum = s.gsum.data();
    }
    const GemvFn fn = pick_gemv(w);
    const int64_t rows = w.rows;
#pragma omp parallel if (rows * kp >= kMinParallelWork)
    {
      const int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
      const int64_t per = (rows + nt - 1) / nt;
      const int64_t r0 = std::min(rows, id * per), r1 = std::min(rows, r0 + per);
      if (r0 < r1) fn(w, a, y, r0, r1);
    }
    return;
  }

  // 2b. Prefill / batched decode: W8A8 semantics are kept by multiplying by the dequantized
  // int8 activations (exact products of integers, summed in fp32).
  if (w.act_int8) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < kp; ++k) xp[t * kp + k] = float(s.xq[t * kp + k]) * s.xscale[t];
  }
  const bool v = use_avx2();
  const int64_t npanels = (w.rows + kPanelRows - 1) / kPanelRows;
#pragma omp parallel for schedule(static) if (w.rows * kp * T >= 16 * kMinParallelWork)
  for (int64_t p = 0; p < npanels; ++p) {
    const int64_t r0 = p * kPanelRows, r1 = std::min(w.rows, r0 + kPanelRows);
    const float* panel;
    if (w.fmt == Fmt::F32) {
      panel = static_cast<const float*>(w.data) + r0 * kp;
    } else {
      float* buf = s.panel.data() + omp_get_thread_num() * kPanelRows * kp;
      scalar::decode_rows(w, r0, r1, buf);
      panel = buf;
    }
    if (v) avx2::panel_gemm(panel, kp, r1 - r0, xp, kp, T, kp, y + r0, ldy);
    else scalar::panel_gemm(panel, kp, r1 - r0, xp, kp, T, kp, y + r0, ldy);
  }
}

void linear_multi(const Weight* const* ws, float* const* ys, int n, const float* x, int64_t T,
                  int64_t ldx, LinearScratch& s) {
  if (T != 1 || n == 1 || n > 4) {
    for (int i = 0; i < n; ++i) linear(*ws[i], x, T, ldx, ys[i], ws[i]->rows, s);
    return;
  }
  const int64_t K = ws[0]->cols;
  int64_t kp = 0, total_rows = 0, work = 0;
  bool any_i8 = false;
  for (int i = 0; i < n; ++i) {
    if (ws[i]->cols != K) throw std::invalid_argument("linear_multi: input widths differ");
    kp = std::max(kp, ws[i]->kp);
    total_rows += ws[i]->rows;
    work += ws[i]->rows * ws[i]->kp;
    any_i8 |= ws[i]->act_int8;
  }
  s.reserve(1, kp);
  float* xp = s.xpad.data();
  std::memcpy(xp, x, size_t(K) * sizeof(float));
  std::fill(xp + K, xp + kp, 0.f);
  float xscale = 0.f;
  if (any_i8) quantize(xp, kp, s.xq.data(), &xscale);
  Act acts[4];
  GemvFn fns[4];
  for (int i = 0; i < n; ++i) {
    const Weight& w = *ws[i];
    acts[i].x = xp;
    acts[i].xq = s.xq.data();
    acts[i].xscale = xscale;
    if (w.fmt == Fmt::I4) {
      float* gs = s.gsum.data() + i * (kp / 32);
      for (int64_t g = 0; g < w.kp / w.group; ++g) {
        float acc = 0.f;
        for (int64_t k = g * w.group; k < (g + 1) * w.group; ++k)
          acc += w.act_int8 ? float(s.xq[k]) : xp[k];
        gs[g] = acc;
      }
      acts[i].gsum = gs;
    }
    fns[i] = pick_gemv(w);
  }
  // Threads split the concatenated rows of all weights into contiguous ranges.
#pragma omp parallel if (work >= kMinParallelWork)
  {
    const int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t per = (total_rows + nt - 1) / nt;
    const int64_t lo = std::min(total_rows, id * per), hi = std::min(total_rows, lo + per);
    int64_t base = 0;
    for (int i = 0; i < n; ++i) {
      const int64_t r0 = std::max(lo, base) - base, r1 = std::min(hi, base + ws[i]->rows) - base;
      if (r0 < r1) fns[i](*ws[i], acts[i], ys[i], r0, r1);
      base += ws[i]->rows;
    }
  }
}

}  // namespace sl
