// Non-GEMM transformer kernels: RMSNorm, RoPE, SwiGLU, residual add, softmax, causal GQA
// attention over a KV cache. Each dispatches (runtime/ops.cpp) to kernels/avx2/ops.cpp or the
// scalar code in kernels/scalar/ops.cpp and runtime/ops.cpp.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "aligned.h"

namespace sl {

// out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w; x, out: (T, D) (may alias).
void rms_norm(const float* x, const float* w, float* out, int64_t T, int64_t D, float eps);

// out[t] = (x[t] - mean) / sqrt(var + eps) * w + b; x, out: (T, D) (may alias); b may be null.
// Scalar (cheap next to the GEMVs); statistics accumulated in double like rms_norm.
void layer_norm(const float* x, const float* w, const float* b, float* out, int64_t T, int64_t D,
                float eps);

// Elementwise activations of the plain (non-gated) MLPs, in place over n.
enum class Activation : int { Silu = 0, GeluTanh = 1, Gelu = 2, Relu = 3 };
void activation(float* x, int64_t n, Activation act);

// cos/sin: (T, half) from angle = pos[t] * inv_freq[i], computed in double like the reference.
void rope_tables(const int64_t* pos, int64_t T, const double* inv_freq, int64_t half, float* cos,
                 float* sin);

// Half-split ("rotate_half") RoPE in place on the first `rot` dims of each head (pairs
// (i, i + rot/2); the other hd - rot dims pass through). x: T rows of `heads` x hd at row
// stride ldx; cos/sin: (T, rot/2).
void apply_rope(float* x, int64_t T, int64_t heads, int64_t hd, int64_t rot, int64_t ldx,
                const float* cos, const float* sin);

// out = silu(g) * u, elementwise over n (out may alias g or u).
void swiglu(const float* g, const float* u, float* out, int64_t n);

// x += y, elementwise over n.
void add_inplace(float* x, const float* y, int64_t n);

// Numerically stable softmax of a row, in place.
void softmax_inplace(float* x, int64_t n);

// out[i] = x[i] rounded to IEEE half (nearest even), as stored in an fp16 KV cache.
void to_half(const float* x, uint16_t* out, int64_t n);

// KV-cache element types. An int8 cache row is hd values and then their float scale (4 bytes):
// x ~= q * scale, symmetric per token and KV head (scale = max|x| / 127.5, as W8A8 activations),
// kept next to its values so that a head's keys stay one stream.
enum class KvType : int { F32 = 0, F16 = 1, I8 = 2 };
constexpr int64_t kKvScaleBytes = 4;
// Elements of KV per cache row of hd values.
template <typename KV>
constexpr int64_t kv_row(int64_t hd) {
  return std::is_same_v<KV, int8_t> ? hd + kKvScaleBytes : hd;
}
// Bytes per cache row of hd values.
inline int64_t kv_row_bytes(KvType t, int64_t hd) {
  return t == KvType::I8 ? kv_row<int8_t>(hd) : t == KvType::F16 ? 2 * hd : 4 * hd;
}
inline float kv_scale(const int8_t* row, int64_t hd) {
  float s;
  __builtin_memcpy(&s, row + hd, sizeof s);
  return s;
}
// Quantizes x (hd,) into an int8 cache row (values, then scale).
void to_kv_int8(const float* x, int64_t hd, int8_t* row);

// Causal grouped-query attention for a flat batch of T query tokens.
//   q:    (T, H, hd) rows at stride ldq;  out: (T, H, hd) rows at stride ldo
//   kc/vc: one layer's cache (slots, KV, cap, row) of s.kv elements, row = kv_row(hd); token t
//          reads slot slots[t], keys [max(0, p - window + 1), p] with p = pos[t] (window <= 0:
//          no sliding window). Scores, softmax and sums are fp32 whatever the cache stores.
// scratch: grown here as needed (each thread's scores; partial results of split keys).
struct AttnShape {
  int64_t T, H, KV, hd, cap;
  float scale;
  int64_t window;
  KvType kv = KvType::F32;
  // The tokens are a prompt chunk: on AVX-512 each sequence's run of consecutive tokens takes
  // the blocked kernel (avx512::attend_block), whose rounding differs from the per-token one's.
  // Decode steps and speculative verification leave it off: their tokens keep the per-token
  // kernel's bits whatever shares their step.
  bool prompt = false;
};
void attention(const float* q, int64_t ldq, const void* kc, const void* vc, const int64_t* slots,
               const int64_t* pos, const AttnShape& s, float* out, int64_t ldo,
               AlignedVector<float>& scratch);

// x = exp(x - max) in place -> {max, sum of the new x}: softmax_inplace before its division.
struct MaxSum {
  float max, sum;
};

// The keys and values the next attend() call of this thread reads, `bytes` from k and from v.
// A batch's caches are cold (the layer's weights went through the caches since), so attend()
// streams them into L2 while it computes (the AVX2 kernel; the scalar reference ignores it).
struct KvPrefetch {
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t bytes = 0;
};

// G query heads of one token that share a KV head: o_g = softmax(scale * K q_g) V over n keys;
// q, o: (G, hd) rows; K, V: n rows of kv_row<KV>(hd), KV = float, uint16_t (IEEE half) or int8_t
// (with scales), all instantiated; sc: G * n floats. With `part` (G x MaxSum) the softmax is
// left undivided: o_g = sum_j e_gj V[j] with e_gj = exp(s_gj - part[g].max), part[g].sum =
// sum_j e_gj, so that attention over parts of the keys can be merged (merge_parts).
// The same row ops in each ISA's namespace (kernels/scalar/ops.cpp, kernels/avx2/ops.cpp).
#define SL_DECLARE_ROW_OPS                                                                  \
  template <typename KV>                                                                    \
  void attend(const float* q, const KV* K, const KV* V, int64_t G, int64_t n, int64_t hd,   \
              float scale, float* sc, float* o, const KvPrefetch& next, MaxSum* part);      \
  void to_half(const float* x, uint16_t* out, int64_t n);                                   \
  void rms_norm_row(const float* x, const float* w, float* out, int64_t D, float eps);      \
  void swiglu(const float* g, const float* u, float* out, int64_t n);                       \
  void softmax_inplace(float* x, int64_t n);                                                \
  MaxSum exp_inplace(float* x, int64_t n);
namespace scalar {
SL_DECLARE_ROW_OPS
}  // namespace scalar
namespace avx2 {
SL_DECLARE_ROW_OPS
}  // namespace avx2
#undef SL_DECLARE_ROW_OPS

// Prompt attention (kernels/avx2/attention.cpp, kernels/avx512/attention.cpp): nq <=
// kAttendBlockQueries consecutive tokens of one sequence, q / out rows ldq / ldo apart, each with G
// <= kAttendMaxGroup query heads (hd a multiple of 8 for AVX2, of 16 for AVX-512) sharing the KV
// head whose keys and values start at K / V; token t of the block sees keys [0, n0 + t). buf:
// attend_block_floats(G, n0 + nq - 1, hd) floats, 64-byte aligned.
constexpr int64_t kAttendBlockQueries = 16, kAttendMaxGroup = 16;
inline int64_t attend_block_floats(int64_t G, int64_t keys, int64_t hd) {
  const int64_t nk = (keys + 31) & ~int64_t(31), m = kAttendBlockQueries * G;
  return hd * nk + nk * hd + m * nk + 2 * m;  // Kt, the values as floats, S, 1 / row sums
}
namespace avx2 {
template <typename KV>
void attend_block(const float* q, int64_t ldq, int64_t nq, int64_t G, const KV* K, const KV* V,
                  int64_t n0, int64_t hd, float scale, float* buf, float* out, int64_t ldo);
}  // namespace avx2
namespace avx512 {
template <typename KV>
void attend_block(const float* q, int64_t ldq, int64_t nq, int64_t G, const KV* K, const KV* V,
                  int64_t n0, int64_t hd, float scale, float* buf, float* out, int64_t ldo);
}  // namespace avx512

}  // namespace sl
