// Transformer ops, portable scalar reference (dispatch: runtime/ops.cpp; the AVX2 twins are in
// kernels/avx2/ops.cpp).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "half.h"
#include "ops.h"

namespace sl {

namespace scalar {

// Int8 rows: a key's dot product is scaled by its scale, and each weight of the softmax by
// its value's scale (the AVX2 twin does the same).
template <typename KV>
void attend(const float* q, const KV* K, const KV* V, int64_t G, int64_t n, int64_t hd,
            float scale, float* sc, float* o, const KvPrefetch&, MaxSum* part) {
  constexpr bool i8 = std::is_same_v<KV, int8_t>;
  const int64_t ld = kv_row<KV>(hd);
  for (int64_t g = 0; g < G; ++g, q += hd, sc += n, o += hd) {
    for (int64_t j = 0; j < n; ++j) {
      float s = 0.f;
      for (int64_t i = 0; i < hd; ++i) s += q[i] * to_float(K[j * ld + i]);
      if constexpr (i8) s *= kv_scale(K + j * ld, hd);
      sc[j] = s * scale;
    }
    if (part) part[g] = exp_inplace(sc, n);
    else softmax_inplace(sc, n);
    if constexpr (i8)
      for (int64_t j = 0; j < n; ++j) sc[j] *= kv_scale(V + j * ld, hd);
    std::fill(o, o + hd, 0.f);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < hd; ++i) o[i] += sc[j] * to_float(V[j * ld + i]);
  }
}

template void attend<float>(const float*, const float*, const float*, int64_t, int64_t, int64_t,
                            float, float*, float*, const KvPrefetch&, MaxSum*);
template void attend<uint16_t>(const float*, const uint16_t*, const uint16_t*, int64_t, int64_t,
                               int64_t, float, float*, float*, const KvPrefetch&, MaxSum*);
template void attend<int8_t>(const float*, const int8_t*, const int8_t*, int64_t, int64_t,
                             int64_t, float, float*, float*, const KvPrefetch&, MaxSum*);

void to_half(const float* x, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = float_to_half(x[i]);
}

void rms_norm_row(const float* x, const float* w, float* out, int64_t D, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < D; ++i) ss += double(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(float(ss / double(D)) + eps);
  for (int64_t i = 0; i < D; ++i) out[i] = x[i] * inv * w[i];
}

void swiglu(const float* g, const float* u, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

MaxSum exp_inplace(float* x, int64_t n) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += (x[i] = std::exp(x[i] - m));
  return {m, s};
}

void softmax_inplace(float* x, int64_t n) {
  const float inv = 1.0f / exp_inplace(x, n).sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace scalar

}  // namespace sl
