// Transformer ops: dispatch (the portable scalar reference is in kernels/scalar/ops.cpp, the AVX2
// twins in kernels/avx2/ops.cpp).
#include "ops.h"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "formats.h"
#include "half.h"
#include "isa.h"
#include "threads.h"

namespace sl {

void rms_norm(const float* x, const float* w, float* out, int64_t T, int64_t D, float eps) {
  const bool v = use_avx2();
  parallel_for(T, T > 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      if (v) avx2::rms_norm_row(x + t * D, w, out + t * D, D, eps);
      else scalar::rms_norm_row(x + t * D, w, out + t * D, D, eps);
    }
  });
}

void layer_norm(const float* x, const float* w, const float* b, float* out, int64_t T, int64_t D,
                float eps) {
  parallel_for(T, T > 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* xr = x + t * D;
      float* o = out + t * D;
      double sum = 0.0;
      for (int64_t i = 0; i < D; ++i) sum += xr[i];
      const double mean = sum / double(D);
      double ss = 0.0;
      for (int64_t i = 0; i < D; ++i) ss += (xr[i] - mean) * (xr[i] - mean);
      const float inv = 1.0f / std::sqrt(float(ss / double(D)) + eps);
      const float m = float(mean);
      for (int64_t i = 0; i < D; ++i) o[i] = (xr[i] - m) * inv * w[i] + (b ? b[i] : 0.f);
    }
  });
}

void activation(float* x, int64_t n, Activation act) {
  constexpr int64_t kParallel = 1 << 15;  // parallel only when it pays (prefill)
  constexpr float kSqrt2OverPi = 0.7978845608028654f, kInvSqrt2 = 0.7071067811865476f;
  const auto apply = [&](auto f) {
    parallel_for(n, n > kParallel, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) x[i] = f(x[i]);
    });
  };
  switch (act) {
    case Activation::Silu:
      apply([](float v) { return v / (1.0f + std::exp(-v)); });
      break;
    case Activation::GeluTanh:
      apply([=](float v) {
        return 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
      });
      break;
    case Activation::Gelu:
      apply([=](float v) { return 0.5f * v * (1.0f + std::erf(v * kInvSqrt2)); });
      break;
    case Activation::Relu:
      apply([](float v) { return std::max(v, 0.0f); });
      break;
  }
}

void rope_tables(const int64_t* pos, int64_t T, const double* inv_freq, int64_t half, float* cos,
                 float* sin) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double ang = double(pos[t]) * inv_freq[i];
      cos[t * half + i] = float(std::cos(ang));
      sin[t * half + i] = float(std::sin(ang));
    }
}

void apply_rope(float* x, int64_t T, int64_t heads, int64_t hd, int64_t rot, int64_t ldx,
                const float* cos, const float* sin) {
  // Elementwise and short: the compiler vectorizes this loop in either ISA build.
  const int64_t half = rot / 2;
  if (half == 0) return;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      float* a = x + t * ldx + h * hd;
      float* b = a + half;
      const float* c = cos + t * half;
      const float* s = sin + t * half;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = a[i], x2 = b[i];
        a[i] = x1 * c[i] - x2 * s[i];
        b[i] = x2 * c[i] + x1 * s[i];
      }
    }
}

void swiglu(const float* g, const float* u, float* out, int64_t n) {
  const bool v = use_avx2();
  constexpr int64_t kChunk = 4096;  // parallel only when it pays (prefill)
  const int64_t nchunks = (n + kChunk - 1) / kChunk;
  parallel_for(nchunks, nchunks > 2, [&](int64_t c0, int64_t c1) {
    const int64_t i0 = c0 * kChunk, m = std::min(c1 * kChunk, n) - i0;
    if (v) avx2::swiglu(g + i0, u + i0, out + i0, m);
    else scalar::swiglu(g + i0, u + i0, out + i0, m);
  });
}

void add_inplace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void softmax_inplace(float* x, int64_t n) {
  if (use_avx2()) avx2::softmax_inplace(x, n); else scalar::softmax_inplace(x, n);
}

void to_half(const float* x, uint16_t* out, int64_t n) {
  if (use_avx2()) avx2::to_half(x, out, n); else scalar::to_half(x, out, n);
}

void to_kv_int8(const float* x, int64_t hd, int8_t* row) {
  float scale;
  quantize_int8_row(x, hd, row, &scale);
  __builtin_memcpy(row + hd, &scale, sizeof scale);
}

// One head's partial attentions over parts of its keys -> out (hd): part p's output is at
// o + p * stride * hd and its MaxSum at ms[p * stride]. out = sum_p w_p o_p / sum_p w_p sum_p,
// w_p = exp(max_p - the largest max). (An empty part, attend() over 0 keys, has max -inf,
// sum 0 and output 0: weight 0.)
static void merge_parts(const float* o, const MaxSum* ms, int64_t parts, int64_t stride,
                        int64_t hd, float* out) {
  float m = -INFINITY;
  for (int64_t p = 0; p < parts; ++p) m = std::max(m, ms[p * stride].max);
  float total = 0.f;
  std::fill(out, out + hd, 0.f);
  for (int64_t p = 0; p < parts; ++p) {
    const float w = std::exp(ms[p * stride].max - m);
    total += w * ms[p * stride].sum;
    for (int64_t i = 0; i < hd; ++i) out[i] += w * o[p * stride * hd + i];
  }
  const float inv = 1.0f / total;
  for (int64_t i = 0; i < hd; ++i) out[i] *= inv;
}

// A task per token and KV head (or part of its keys): steps that are not prompt chunks, and
// what the blocked kernel does not take.
template <typename KV>
static void attention_tokens(const float* q, int64_t ldq, const KV* kc, const KV* vc,
                             const int64_t* slots, const int64_t* pos, const AttnShape& s,
                             float* out, int64_t ldo, AlignedVector<float>& scratch) {
  const auto attend = use_avx2() ? avx2::attend<KV> : scalar::attend<KV>;
  const int64_t nt = num_threads(), group = s.H / s.KV, groups = s.T * s.KV;
  const auto first_key = [&](int64_t t) {
    return s.window > 0 ? std::max<int64_t>(0, pos[t] - s.window + 1) : 0;
  };
  int64_t keys = 0, longest = 0;
  for (int64_t t = 0; t < s.T; ++t) {
    keys += pos[t] + 1 - first_key(t);
    longest = std::max(longest, pos[t] + 1 - first_key(t));
  }
  // A task is one token's query heads that share a KV head, so each key and value is loaded once
  // for all of them (SmolLM2: 3 per KV head). A decode step of one or two sequences has too few of
  // those to keep the threads busy (SmolLM2: 3 for 2 threads), so each one's keys are split into
  // parts (flash-decoding): about 8 tasks per thread, a number the threads share evenly, none
  // under kPartKeys keys; merge_parts combines their softmax pieces, which pays after long prompts.
  // Over fewer keys, a task is one head (the heads of a group find their keys in L2).
  constexpr int64_t kPartKeys = 128;
  int64_t parts = 1;
  if (nt > 1 && groups < 4 * nt) {
    parts = (8 * nt + groups - 1) / groups;
    while (groups * parts % nt) ++parts;
    parts = std::min(parts, (longest + kPartKeys - 1) / kPartKeys);
    while (parts > 1 && groups * parts % nt) --parts;
  }
  const int64_t per_task = groups >= 4 * nt || parts > 1 ? group : 1;
  const int64_t tasks_per_token = s.H / per_task * parts, tasks = s.T * tasks_per_token;
  // scratch: per thread the scores of a task; with parts, their outputs and MaxSums.
  const int64_t nsc = nt * per_task * s.cap, nparts = parts > 1 ? tasks * per_task : 0;
  if (int64_t(scratch.size()) < nsc + nparts * (s.hd + 2))
    scratch.resize(size_t(nsc + nparts * (s.hd + 2)));
  float* o_parts = scratch.data() + nsc;
  MaxSum* ms_parts = reinterpret_cast<MaxSum*>(o_parts + nparts * s.hd);
  struct Span {
    int64_t t, h, n, kv;  // token, first head, keys, offset of its first key in the layer
  };
  const auto locate = [&](int64_t task) {
    const int64_t t = task / tasks_per_token, r = task % tasks_per_token;
    const int64_t h = r / parts * per_task, part = r % parts;
    const int64_t first = first_key(t), n = pos[t] + 1 - first;
    const int64_t k0 = first + n * part / parts, k1 = first + n * (part + 1) / parts;
    return Span{t, h, k1 - k0, ((slots[t] * s.KV + h / group) * s.cap + k0) * kv_row<KV>(s.hd)};
  };
  // Keys that no earlier token of this call read, which come from DRAM: each token's in a
  // batch's decode step, only the first token's in a prefill or a verification (tokens of a
  // sequence are adjacent, and the later ones find the keys the earlier ones brought in).
  const auto cold = [&](int64_t t) { return t == 0 || slots[t] != slots[t - 1]; };
  // Causal prefill tasks differ in length -> handed out in chunks of ~4 heads from a shared
  // counter. Work ~ T * H * keys * hd. Split across threads from 2^14 (SmolLM2: 29+ keys): a
  // fork/join of the pool costs a few microseconds, and one sequence's decode step over 96 /
  // 160 keys took 9.6 / 14.8 us per layer on one thread, 6.8-7.6 / 9.5-10.5 on two (2^17
  // before). Only a decode step over a very short context stays on one thread.
  const int64_t chunk = std::max<int64_t>(1, 4 / per_task / parts);
  std::atomic<int64_t> next{0};
  parallel(keys * s.H * s.hd >= (int64_t(1) << 14), [&](int id, int) {
    float* sc = scratch.data() + id * per_task * s.cap;
    int64_t task = next.fetch_add(chunk, std::memory_order_relaxed), end = task + chunk;
    while (task < tasks) {
      // Claimed one task ahead, so that this one can prefetch what that one reads.
      int64_t after = task + 1;
      if (after == end) end = (after = next.fetch_add(chunk, std::memory_order_relaxed)) + chunk;
      const Span a = locate(task);
      KvPrefetch pf;
      if (after < tasks && per_task == group) {  // (tasks of single heads share their keys)
        const Span b = locate(after);
        if (cold(b.t)) pf = {kc + b.kv, vc + b.kv, b.n * kv_row<KV>(s.hd) * int64_t(sizeof(KV))};
      }
      // With parts, the pieces to merge (a part of a short context may have no keys).
      float* o = parts == 1 ? out + a.t * ldo + a.h * s.hd : o_parts + task * per_task * s.hd;
      MaxSum* ms = parts == 1 ? nullptr : ms_parts + task * per_task;
      attend(q + a.t * ldq + a.h * s.hd, kc + a.kv, vc + a.kv, per_task, a.n, s.hd, s.scale, sc,
             o, pf, ms);
      task = after;
    }
  });
  if (parts == 1) return;
  // Tasks are (token, block of heads, part) in that order; head h is h % per_task of its block.
  for (int64_t t = 0; t < s.T; ++t)
    for (int64_t h = 0; h < s.H; ++h) {
      const int64_t i = (t * tasks_per_token + h / per_task * parts) * per_task + h % per_task;
      merge_parts(o_parts + i * s.hd, ms_parts + i, parts, per_task, s.hd,
                  out + t * ldo + h * s.hd);
    }
}

// Prompt chunks on AVX2 and AVX-512 (AttnShape::prompt, attend_block): each run of consecutive
// tokens of a sequence in blocks of kAttendBlockQueries, a task per block and KV head, handed
// out from a shared counter, the blocks with the most keys first. A token's result depends on
// its own keys only, not on its block (kernels/avx2/attention.cpp, kernels/avx512/attention.cpp).
// Other steps, sliding windows and head shapes the blocked kernels do not take: attention_tokens.
template <typename KV>
static void attention_kv(const float* q, int64_t ldq, const KV* kc, const KV* vc,
                         const int64_t* slots, const int64_t* pos, const AttnShape& s, float* out,
                         int64_t ldo, AlignedVector<float>& scratch) {
  const int64_t G = s.H / s.KV, Q = kAttendBlockQueries;
  const auto block = use_avx512() && s.hd % 16 == 0 ? avx512::attend_block<KV>
                     : use_avx2() && s.hd % 8 == 0   ? avx2::attend_block<KV>
                                                     : nullptr;
  if (!s.prompt || !block || s.window > 0 || G > kAttendMaxGroup)
    return attention_tokens(q, ldq, kc, vc, slots, pos, s, out, ldo, scratch);
  std::vector<int64_t> starts, ends;  // blocks [starts[i], ends[i])
  int64_t longest = 0;
  for (int64_t a = 0, b; a < s.T; a = b) {
    b = a + 1;  // the run [a, b): one slot, consecutive positions
    while (b < s.T && slots[b] == slots[a] && pos[b] == pos[b - 1] + 1) ++b;
    for (int64_t t = a; t < b; t += Q) {
      starts.push_back(t);
      ends.push_back(std::min(b, t + Q));
    }
    longest = std::max(longest, pos[b - 1] + 1);
  }
  const int64_t nb = int64_t(starts.size()), tasks = nb * s.KV;
  const int64_t per_thread = (attend_block_floats(G, longest, s.hd) + 15) & ~int64_t(15);
  std::vector<int64_t> order(static_cast<size_t>(nb));  // the blocks with the most keys first
  for (int64_t i = 0; i < nb; ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](int64_t x, int64_t y) { return pos[starts[x]] > pos[starts[y]]; });
  if (int64_t(scratch.size()) < num_threads() * per_thread)
    scratch.resize(size_t(num_threads() * per_thread));
  std::atomic<int64_t> next{0};
  parallel(tasks > 1, [&](int id, int) {
    float* buf = scratch.data() + id * per_thread;
    for (int64_t task; (task = next.fetch_add(1, std::memory_order_relaxed)) < tasks;) {
      const int64_t i = order[task / s.KV], h = task % s.KV;
      const int64_t t0 = starts[i], kv = (slots[t0] * s.KV + h) * s.cap * kv_row<KV>(s.hd);
      block(q + t0 * ldq + h * G * s.hd, ldq, ends[i] - t0, G, kc + kv, vc + kv, pos[t0] + 1,
            s.hd, s.scale, buf, out + t0 * ldo + h * G * s.hd, ldo);
    }
  });
}

void attention(const float* q, int64_t ldq, const void* kc, const void* vc, const int64_t* slots,
               const int64_t* pos, const AttnShape& s, float* out, int64_t ldo,
               AlignedVector<float>& scratch) {
  switch (s.kv) {
    case KvType::F32:
      return attention_kv(q, ldq, static_cast<const float*>(kc), static_cast<const float*>(vc),
                          slots, pos, s, out, ldo, scratch);
    case KvType::F16:
      return attention_kv(q, ldq, static_cast<const uint16_t*>(kc),
                          static_cast<const uint16_t*>(vc), slots, pos, s, out, ldo, scratch);
    case KvType::I8:
      return attention_kv(q, ldq, static_cast<const int8_t*>(kc), static_cast<const int8_t*>(vc),
                          slots, pos, s, out, ldo, scratch);
  }
}

}  // namespace sl
