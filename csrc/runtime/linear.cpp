// Linear-layer driver shared by the Python `linear()` and NativeModel.
#include "linear.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <type_traits>

#include "formats.h"
#include "isa.h"
#include "kernels.h"
#include "threads.h"

namespace sl {

// The format's GEMV for this weight's activations on the active ISA (kFmtTraits, formats.h).
static const Gemv& pick_gemv(const Weight& w) {
  const GemvSet& k = fmt_traits(w.fmt).gemvs(w.act_int8);
  if (use_avx512() && k.avx512.fn) return k.avx512;
  return use_avx2() ? k.avx2 : k.scalar;
}

static int64_t g_gemv_max_tokens = 0;  // 0: the per-format defaults (kFmtTraits)
int64_t gemv_max_tokens(const Weight& w) {
  if (g_gemv_max_tokens > 0) return g_gemv_max_tokens;
  const GemvSet& k = fmt_traits(w.fmt).gemvs(w.act_int8);
  if (use_avx512() && k.avx512_max_tokens) return k.avx512_max_tokens;
  if (use_avx2() && k.avx2_max_tokens) return k.avx2_max_tokens;
  return k.max_tokens;
}

int64_t int_gemm_act_group(const Weight& w) {
  if (fmt_traits(w.fmt).is_float || !use_avx2()) return -1;
  if (w.fmt == Fmt::I4K && use_avx512()) return -1;  // no AVX-512 kernel reads its scales
  if (w.act_int8) return 0;
  if (use_avx512()) return fmt_traits(w.fmt).grouped ? w.group : 32;
  // kernels/avx2/gemm_int.cpp: int4 (dense, bitmask) multiplies bytes; the others keep fp32 panels
  return is_int4(w.fmt) ? w.group : -1;
}
void set_gemv_max_tokens(int64_t n) { g_gemv_max_tokens = std::max<int64_t>(0, n); }

void LinearScratch::reserve(int64_t T, int64_t kp) {
  auto grow = [](auto& v, size_t n) {
    if (v.size() < n) v.resize(n);
  };
  grow(xpad, size_t(T * kp));
  grow(xq, size_t(T * kp));
  grow(xscale, size_t(T));
  grow(xsum, size_t(T));
  grow(gsum, size_t(kMaxMulti * T * kp / 32));
  if (use_avx512()) grow(xu, size_t(T * kp));  // the integer codes this ISA multiplies
  else if (use_avx2()) grow(xw, size_t(T * kp));
  grow(xgscale, size_t(T * kp / 32));
}

// Below this many weight x token products a parallel region costs more than it saves (fork/join
// is microseconds, and much worse when the cores are oversubscribed), so run on one thread.
// (GEMM: 16x more, as its work per weight byte is compute, not a DRAM stream.)
constexpr int64_t kMinParallelWork = int64_t(1) << 16;

// Per-token sums of x (T, kp) over each group of columns -> out (T, kp / group). int8 values are
// summed as int32, which vectorizes (a float sum is a serial chain of adds) and is exact, as the
// float sum of at most 2^24 / 128 int8 values is.
template <typename X>
static void group_sums(const X* x, int64_t T, int64_t kp, int64_t group, float* out) {
  using Acc = std::conditional_t<std::is_integral_v<X>, int32_t, float>;
  const int64_t ng = kp / group;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < ng; ++g) {
      Acc acc = 0;
      for (int64_t k = t * kp + g * group; k < t * kp + (g + 1) * group; ++k) acc += Acc(x[k]);
      out[t * ng + g] = float(acc);
    }
}

// Row x (K) -> out (kp), zero padded: kernels have no tail loops.
static void pad_row(const float* x, int64_t K, int64_t kp, float* out) {
  std::memcpy(out, x, size_t(K) * sizeof(float));
  std::fill(out + K, out + kp, 0.f);
}

// Zero-pads x (T, K) to xpad (T, kp) (pad_row) and quantizes each token
// for W8A8 (per-token scale; the same for every weight, so done once per call).
static void prepare(const float* x, int64_t T, int64_t ldx, int64_t K, int64_t kp, bool int8,
                    LinearScratch& s) {
  s.reserve(T, kp);  // no-op once sized
  float* xp = s.xpad.data();
  for (int64_t t = 0; t < T; ++t) pad_row(x + t * ldx, K, kp, xp + t * kp);
  if (int8)
    for (int64_t t = 0; t < T; ++t) {
      int8_t* q = s.xq.data() + t * kp;
      quantize_int8_row(xp + t * kp, kp, q, &s.xscale[t]);
      if (use_avx512()) s.xsum[t] = std::accumulate(q, q + kp, int32_t(0));  // read by them only
    }
}

// Calls f(PanelRows) for w's panels of kPanelRows rows, the threads taking contiguous runs.
template <class F>
static void for_panels(const Weight& w, int64_t T, F&& f) {
  const int64_t npanels = (w.rows + kPanelRows - 1) / kPanelRows;
  parallel(w.rows * w.kp * T >= 16 * kMinParallelWork, [&](int id, int nt) {
    for (int64_t p = id * npanels / nt; p < (id + 1) * npanels / nt; ++p) {
      const int64_t r0 = p * kPanelRows;
      f(PanelRows{w, r0, std::min(w.rows - r0, kPanelRows)});
    }
  });
}

// Prefill: W8A8 semantics are kept by multiplying by the dequantized int8 activations (exact
// products of integers, summed in fp32). Needs prepare() for this weight alone.
static void panel_linear(const Weight& w, int64_t T, float* y, int64_t ldy, LinearScratch& s) {
  const int64_t kp = w.kp;
  float* xp = s.xpad.data();
  if (w.act_int8) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < kp; ++k) xp[t * kp + k] = float(s.xq[t * kp + k]) * s.xscale[t];
  }
  const auto gemm = use_avx512() ? avx512::panel_gemm
                    : use_avx2()  ? avx2::panel_gemm
                                  : scalar::panel_gemm;
  for_panels(w, T, [&](const PanelRows& p) { gemm(p, xp, kp, T, y + p.r0, ldy); });
}

const float* PanelRows::rows(int64_t i, int64_t n, float* buf) const {
  if (w.fmt == Fmt::F32) return static_cast<const float*>(w.data) + (r0 + i) * w.kp;
  decode_rows(w, r0 + i, r0 + i + n, buf);
  return buf;
}

int64_t group_int8_act_group(const Weight& w) {
  if (w.act_int8 || !pick_gemv(w).group_int8) return -1;
  return fmt_traits(w.fmt).grouped ? w.group : 32;  // int8: per 32 columns, as Q8_0
}

// Whether a weight-only weight's GEMV runs on x quantized per group of columns.
static bool group_int8(const Weight& w, const LinearScratch& s) {
  return s.group_int8 && group_int8_act_group(w) > 0;
}

// The integer GEMM (AVX-512: int8 VNNI; AVX2: W8A8 as exact fp32 FMAs on the codes, int4 by
// int8 maddubs):
// activations as integer codes (W8A8 / W4A8: the GEMV's per-token int8; weight-only prompts,
// and under group_int8 every T: quantized per group of columns, int_gemm_act_group), in
// parallel over tokens, once for every weight of the same width and activation group (q/k/v,
// gate/up), then the GEMM of each weight in parallel over units of rows.
static bool int_gemm_takes(const Weight& w, const LinearScratch& s) {
  return int_gemm_act_group(w) >= 0 && (w.act_int8 || s.prompt || group_int8(w, s));
}

// The activations of weights ws[0 .. n), which share them (the same int_gemm_act_group).
static GemmActs int_gemm_acts(const Weight* const* ws, int n, const float* x, int64_t T,
                              int64_t ldx, LinearScratch& s) {
  const Weight& w = *ws[0];
  const int64_t kp = w.kp, K = w.cols, group = int_gemm_act_group(w);
  const bool vnni = use_avx512();
  bool int4 = false, int8 = false;  // AVX2: which kernels read them
  for (int i = 0; i < n; ++i)
    (is_int4(ws[i]->fmt) ? int4 : int8) = true;
  s.reserve(T, kp);
  parallel_for(T, T * kp >= kMinParallelWork, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      float* xp = s.xpad.data() + t * kp;
      float* xs = group ? s.xgscale.data() + t * (kp / group) : &s.xscale[t];
      int8_t* q = s.xq.data() + t * kp;
      pad_row(x + t * ldx, K, kp, xp);
      if (vnni && group) {
        avx512::quantize_groups(xp, kp, group, s.xu.data() + t * kp, xs);
      } else if (vnni) {
        avx512::quantize_row_u8(xp, kp, s.xu.data() + t * kp, xs);
      } else {  // AVX2: the codes; as floats (in place of x) for W8A8, their sums for int4
        if (group) avx2::quantize_groups(xp, kp, group, q, xs);  // weight-only int4
        else avx2::quantize_row(xp, kp, q, xs);
        if (int8)
          for (int64_t k = 0; k < kp; ++k) xp[k] = float(q[k]);
        if (int4) group_sums(q, 1, kp, 32, s.gsum.data() + t * (kp / 32));
      }
    }
  });
  GemmActs a;
  a.T = T;
  a.xu = s.xu.data();
  a.xf = s.xpad.data();
  a.xq = s.xq.data();
  a.gsum = s.gsum.data();
  a.xs = group ? s.xgscale.data() : s.xscale.data();
  return a;
}

static void int_gemm_run(const Weight& w, const GemmActs& a, float* y, int64_t ldy) {
  const bool vnni = use_avx512();
  if (!vnni && !is_int4(w.fmt))  // AVX2 W8A8: the panel GEMM on the codes
    return for_panels(w, a.T, [&](const PanelRows& p) {
      avx2::panel_gemm_codes(p, a.xf, w.kp, a.T, y + p.r0, ldy, a.xs);
    });
  const int64_t unit = vnni ? 2 * kRowBlock16 : kRowBlock16;  // the kernels' row granules
  parallel_for((w.rows + unit - 1) / unit, w.rows * w.kp * a.T >= 16 * kMinParallelWork,
               [&](int64_t lo, int64_t hi) {
                 const int64_t r0 = lo * unit, r1 = std::min(w.rows, hi * unit);
                 if (vnni) avx512::int8_gemm(w, a, y, ldy, r0, r1);
                 else avx2::int_gemm(w, a, y, ldy, r0, r1);
               });
}

// Bitmask fp32 prompts on AVX-512 multiply only the kept weights (kernels/avx512/gemm_sparse.cpp),
// from this many tokens: below, each kept weight's scalar work (its column, its broadcast) is
// shared by too few tokens, and the dense panel GEMM over decoded rows wins (the crossover measured
// at TinyLlama-1.1B shapes, 50% sparse).
constexpr int64_t kSparseF32GemmMinTokens = 64;

static void sparse_f32_gemm(const Weight& w, const float* x, int64_t T, int64_t ldx, float* y,
                            int64_t ldy, LinearScratch& s) {
  prepare(x, T, ldx, w.cols, w.kp, false, s);
  const int64_t tiles = (T + avx512::kSparseTile - 1) / avx512::kSparseTile;
  if (s.xt.size() < size_t(tiles * avx512::kSparseTile * w.kp))  // bitmask fp32 models only
    s.xt.resize(size_t(tiles * avx512::kSparseTile * w.kp));
  avx512::transpose_tokens(s.xpad.data(), T, w.kp, s.xt.data());
  constexpr int64_t kUnit = 32;
  parallel_for((w.rows + kUnit - 1) / kUnit, w.rows * w.kp * T >= 16 * kMinParallelWork,
               [&](int64_t lo, int64_t hi) {
                 avx512::sp_f32_gemm(w, s.xt.data(), T, y, ldy, lo * kUnit,
                                     std::min(w.rows, hi * kUnit));
               });
}

// Weight i's activations for its Gemv::group_int8 kernel: x (acts[i].x) quantized per
// group_int8_act_group columns (xq, xgscale) and, for kernels with a zero-point term
// (Gemv::group_sums), each group's code sum times its scale (gsum); or those of an earlier
// weight with the same group.
static void group_int8_acts(const Weight* const* ws, Acts* acts, int i, LinearScratch& s) {
  const Weight& w = *ws[i];
  const int64_t group = group_int8_act_group(w);
  const bool sums = pick_gemv(w).group_sums;
  Acts& a = acts[i];
  for (int j = 0; j < i; ++j)
    if (acts[j].xgscale && group_int8_act_group(*ws[j]) == group && (acts[j].gsum || !sums)) {
      a.xq = acts[j].xq, a.xgscale = acts[j].xgscale, a.gsum = acts[j].gsum;
      return;
    }
  const int64_t T = a.T, kp = w.kp, ng = kp / group;
  if (s.xgq.size() < size_t(kMaxMulti * T * kp)) s.xgq.resize(size_t(kMaxMulti * T * kp));
  if (s.xgscale.size() < size_t(kMaxMulti * T * kp / 32))
    s.xgscale.resize(size_t(kMaxMulti * T * kp / 32));
  int8_t* q = s.xgq.data() + i * T * kp;
  float* xs = s.xgscale.data() + i * T * (kp / 32);
  for (int64_t t = 0; t < T; ++t)
    avx2::quantize_groups(a.x + t * kp, kp, group, q + t * kp, xs + t * ng);
  a.xq = q, a.xgscale = xs, a.gsum = nullptr;
  if (!sums) return;
  float* gs = s.gsum.data() + i * T * (kp / 32);
  group_sums(q, T, kp, group, gs);
  for (int64_t k = 0; k < T * ng; ++k) gs[k] *= xs[k];
  a.gsum = gs;
}

// The GEMV path for n weights with the same padded width: activations prepared once, then one
// parallel region in which the threads split the concatenated rows of all weights into
// contiguous ranges, in blocks of 16 rows (Fmt::I8_R16's unit; a kernel call starts on one).
static void gemv_multi(const Weight* const* ws, float* const* ys, const int64_t* ldys, int n,
                       const float* x, int64_t T, int64_t ldx, LinearScratch& s) {
  const int64_t kp = ws[0]->kp;
  int64_t total_rows = 0, total_blocks = 0;
  bool any_i8 = false;
  for (int i = 0; i < n; ++i) {
    total_rows += ws[i]->rows;
    total_blocks += row_blocks16(ws[i]->rows);
    any_i8 |= ws[i]->act_int8;
  }
  prepare(x, T, ldx, ws[0]->cols, kp, any_i8, s);
  Acts acts[kMaxMulti];
  GemvFn fns[kMaxMulti];
  bool widened = false;  // s.xw holds xq as int16 (once for all the weights that read it)
  for (int i = 0; i < n; ++i) {
    const Weight& w = *ws[i];
    Acts& a = acts[i];
    a.T = T;
    a.x = s.xpad.data();
    a.xq = s.xq.data();
    a.xscale = s.xscale.data();
    a.xsum = s.xsum.data();
    a.xw = s.xw.data();
    const Gemv& gemv = pick_gemv(w);
    fns[i] = gemv.fn;
    if (group_int8(w, s)) {
      fns[i] = gemv.group_int8;
      group_int8_acts(ws, acts, i, s);
      continue;
    }
    if (gemv.int16_codes && !widened) {
      for (int64_t t = 0; t < T; ++t) avx2::widen_codes(a.xq + t * kp, kp, s.xw.data() + t * kp);
      widened = true;
    }
    // (Only for kernels that read them, kFmtTraits' kGroupSums: dense int4, and sparse W4A8 on
    // AVX-512; the other sparse W4A8 kernels multiply signed values.)
    if (gemv.group_sums) {
      // Group sums of the activations the kernel multiplies (zero-point term), per token;
      // fused int4 weights with the same groups (q/k/v, gate/up) share one computation.
      for (int j = 0; j < i && !a.gsum; ++j)
        if (ws[j]->group == w.group && ws[j]->act_int8 == w.act_int8 && acts[j].gsum &&
            !acts[j].xgscale)
          a.gsum = acts[j].gsum;
      if (!a.gsum) {
        float* gs = s.gsum.data() + i * T * (kp / 32);
        if (w.act_int8) group_sums(s.xq.data(), T, kp, w.group, gs);
        else group_sums(s.xpad.data(), T, kp, w.group, gs);
        a.gsum = gs;
      }
    }
  }
  parallel_for(total_blocks, total_rows * kp * T >= kMinParallelWork, [&](int64_t lo, int64_t hi) {
    int64_t base = 0;  // first block of weight i
    for (int i = 0; i < n; ++i) {
      const int64_t rows = ws[i]->rows, nb = row_blocks16(rows);
      const int64_t b0 = std::max(lo, base) - base, b1 = std::min(hi, base + nb) - base;
      if (b0 < b1)
        fns[i](*ws[i], acts[i], ys[i], ldys[i], b0 * kRowBlock16, std::min(rows, b1 * kRowBlock16));
      base += nb;
    }
  });
}

// Whether the GEMV serves T tokens: up to its limit, and at every T outside a prompt where it
// quantizes x per group of columns (group_int8) and no integer GEMM takes the same codes (AVX2
// weight-only int8): batched decode and speculative verification then give each token its
// one-token bits, where the fp32 GEMM's would differ by x's quantization.
static bool gemv_takes(const Weight& w, int64_t T, const LinearScratch& s) {
  return T <= gemv_max_tokens(w) || (group_int8(w, s) && !s.prompt && int_gemm_act_group(w) < 0);
}

void linear(const Weight& w, const float* x, int64_t T, int64_t ldx, float* y, int64_t ldy,
            LinearScratch& s) {
  const Weight* ws[1] = {&w};
  if (gemv_takes(w, T, s)) {
    float* ys[1] = {y};
    gemv_multi(ws, ys, &ldy, 1, x, T, ldx, s);
    return;
  }
  if (int_gemm_takes(w, s)) return int_gemm_run(w, int_gemm_acts(ws, 1, x, T, ldx, s), y, ldy);
  if (w.fmt == Fmt::SP_F32 && use_avx512() && T >= kSparseF32GemmMinTokens)
    return sparse_f32_gemm(w, x, T, ldx, y, ldy, s);
  prepare(x, T, ldx, w.cols, w.kp, w.act_int8, s);
  panel_linear(w, T, y, ldy, s);
}

void linear_multi(const Weight* const* ws, float* const* ys, int n, const float* x, int64_t T,
                  int64_t ldx, LinearScratch& s) {
  if (n < 1 || n > kMaxMulti) throw std::invalid_argument("linear_multi: 1..4 weights");
  bool same_kp = true, gemv = true;
  int64_t ldys[kMaxMulti];
  for (int i = 0; i < n; ++i) {
    gemv &= gemv_takes(*ws[i], T, s);
    if (ws[i]->cols != ws[0]->cols)
      throw std::invalid_argument("linear_multi: input widths differ");
    same_kp &= ws[i]->kp == ws[0]->kp;  // differs only for mixed int4 group sizes
    ldys[i] = ws[i]->rows;
  }
  if (gemv && same_kp) {
    gemv_multi(ws, ys, ldys, n, x, T, ldx, s);
    return;
  }
  bool shared = same_kp;  // one integer GEMM preparation for all of them
  for (int i = 0; i < n; ++i)
    shared &= int_gemm_takes(*ws[i], s) && int_gemm_act_group(*ws[i]) == int_gemm_act_group(*ws[0]);
  if (shared) {
    const GemmActs a = int_gemm_acts(ws, n, x, T, ldx, s);
    for (int i = 0; i < n; ++i) int_gemm_run(*ws[i], a, ys[i], ldys[i]);
    return;
  }
  for (int i = 0; i < n; ++i) linear(*ws[i], x, T, ldx, ys[i], ldys[i], s);
}

}  // namespace sl
