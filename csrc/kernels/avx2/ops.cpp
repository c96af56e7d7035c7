// Transformer ops, AVX2+FMA twins of runtime/ops.cpp's scalar reference (same math, vectorized).
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "ops.h"
#include "half.h"
#include "kernels/codegen.h"
#include "kernels/avx2/simd.h"

namespace sl::avx2 {

// exp(x) for 8 floats: 2^n * p(r), x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial
// (Cephes expf coefficients; max rel. error ~2 ulp). Inputs are clamped to the finite range.
static inline __m256 exp256(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// 8 KV-cache elements as fp32.
static inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
static inline __m256 load8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
static inline __m256 load8(const int8_t* p) {
  const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
}

template <typename KV>
static inline float dot(const float* a, const KV* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), load8(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8(b + i), s0);
  float s = hsum(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += a[i] * to_float(b[i]);
  return s;
}

// [sum(a[0]), sum(a[1]), sum(a[2]), sum(a[3])]: three hadds for four dot products, where a
// horizontal sum per key took six instructions.
static inline __m128 reduce4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// sc[g * n + j] = scale * q_g . K[j] for NG heads q_g = q + g * hd (NG <= 3): four keys at a
// time, each 8 columns of a key loaded once for all NG heads (12 accumulators + 3 query vectors
// + 1 key vector fill the 16 registers). V and next (unless null) are only prefetched. Rows are
// ld elements apart (kv_row); int8 keys' dot products are multiplied by their scales.
template <int NG, typename KV>
static void head_scores(const float* q, const KV* K, const KV* V, const KvPrefetch* next,
                        int64_t n, int64_t hd, float scale, float* sc) {
  constexpr bool i8 = std::is_same_v<KV, int8_t>;
  const int64_t ld = kv_row<KV>(hd), hd8 = hd & ~int64_t(7);
  const __m128 sv = _mm_set1_ps(scale);
  // The next task's keys and values, an equal share of lines per four keys: they are on their
  // way while this task computes, which matters for a batch of sequences' cold caches. (The next
  // part of a long context's keys, too: attention_kv.)
  const int64_t share =
      next && next->bytes && n >= 4 ? (next->bytes / (n / 4) + 64) & ~int64_t(63) : 0;
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    if (share) {
      const int64_t b0 = j / 4 * share, b1 = std::min(next->bytes, b0 + share);
      for (int64_t b = b0; b < b1; b += 64) {
        _mm_prefetch(static_cast<const char*>(next->k) + b, _MM_HINT_T1);
        _mm_prefetch(static_cast<const char*>(next->v) + b, _MM_HINT_T1);
      }
    }
    const KV* k = K + j * ld;
    // These keys' values on their way to L2 for the weighted sums that follow: a batch of
    // sequences' caches is cold (the layer's weights went through the cache since), and with
    // 96 keys per sequence the hardware prefetcher alone leaves the V pass waiting on DRAM.
    if (V) {
      const char* pv = reinterpret_cast<const char*>(V + j * ld);
      for (int64_t b = 0; b < int64_t(4 * ld * sizeof(KV)); b += 64)
        _mm_prefetch(pv + b, _MM_HINT_T1);
    }
    __m256 acc[NG][4];
    SL_UNROLL for (int g = 0; g < NG; ++g)
      SL_UNROLL for (int i = 0; i < 4; ++i) acc[g][i] = _mm256_setzero_ps();
    for (int64_t d = 0; d < hd8; d += 8) {
      __m256 qd[NG];
      for (int g = 0; g < NG; ++g) qd[g] = _mm256_loadu_ps(q + g * hd + d);
      for (int i = 0; i < 4; ++i) {
        const __m256 kv = load8(k + i * ld + d);
        for (int g = 0; g < NG; ++g) acc[g][i] = _mm256_fmadd_ps(qd[g], kv, acc[g][i]);
      }
    }
    SL_UNROLL for (int g = 0; g < NG; ++g) {
      __m128 s = reduce4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
      if (hd8 < hd) {  // columns past the last 8 (odd head sizes)
        alignas(16) float tail[4] = {};
        for (int i = 0; i < 4; ++i)
          for (int64_t d = hd8; d < hd; ++d) tail[i] += q[g * hd + d] * to_float(k[i * ld + d]);
        s = _mm_add_ps(s, _mm_load_ps(tail));
      }
      if constexpr (i8)
        s = _mm_mul_ps(s, _mm_setr_ps(kv_scale(k, hd), kv_scale(k + ld, hd),
                                      kv_scale(k + 2 * ld, hd), kv_scale(k + 3 * ld, hd)));
      _mm_storeu_ps(sc + g * n + j, _mm_mul_ps(s, sv));
    }
  }
  for (; j < n; ++j)
    for (int g = 0; g < NG; ++g) {
      float s = dot(q + g * hd, K + j * ld, hd);
      if constexpr (i8) s *= kv_scale(K + j * ld, hd);
      sc[g * n + j] = s * scale;
    }
}

// o_g[c, c + 8 * NV) = sum_j sc[g * n + j] * V[j, c, c + 8 * NV) for NG heads (rows of V ld
// elements apart, of o hd): the output columns stay in registers over all keys (an axpy per
// key loaded and stored them for every key), and each V vector is loaded once for all NG
// heads. 8 (one head) or 12 accumulators: fewer were bound by the FMA latency (one FMA per key
// on each chain).
template <int NG, int NV, typename KV>
static inline void weighted_sums(const float* sc, const KV* V, int64_t n, int64_t ld, float* o,
                                 int64_t hd) {
  __m256 acc[NG][NV];
  SL_UNROLL for (int g = 0; g < NG; ++g)
    SL_UNROLL for (int i = 0; i < NV; ++i) acc[g][i] = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    __m256 s[NG];
    for (int g = 0; g < NG; ++g) s[g] = _mm256_broadcast_ss(sc + g * n + j);
    for (int i = 0; i < NV; ++i) {
      const __m256 v = load8(V + j * ld + 8 * i);
      for (int g = 0; g < NG; ++g) acc[g][i] = _mm256_fmadd_ps(s[g], v, acc[g][i]);
    }
  }
  SL_UNROLL for (int g = 0; g < NG; ++g)
    SL_UNROLL for (int i = 0; i < NV; ++i) _mm256_storeu_ps(o + g * hd + 8 * i, acc[g][i]);
}

// next: null but for the first block of heads over these keys (the one that prefetches).
template <int NG, typename KV>
static void attend_heads(const float* q, const KV* K, const KV* V, int64_t n, int64_t hd,
                         float scale, float* sc, float* o, const KvPrefetch* next,
                         MaxSum* part) {
  const int64_t ld = kv_row<KV>(hd);
  head_scores<NG>(q, K, next ? V : nullptr, next, n, hd, scale, sc);
  for (int g = 0; g < NG; ++g) {
    if (part) part[g] = exp_inplace(sc + g * n, n);
    else softmax_inplace(sc + g * n, n);
  }
  if constexpr (std::is_same_v<KV, int8_t>)  // each weight times its value's scale
    for (int64_t j = 0; j < n; ++j) {
      const float vs = kv_scale(V + j * ld, hd);
      for (int g = 0; g < NG; ++g) sc[g * n + j] *= vs;
    }
  constexpr int NV = NG == 1 ? 8 : 4;
  int64_t c = 0;
  for (; c + 8 * NV <= hd; c += 8 * NV) weighted_sums<NG, NV>(sc, V + c, n, ld, o + c, hd);
  for (; c + 8 <= hd; c += 8) weighted_sums<NG, 1>(sc, V + c, n, ld, o + c, hd);
  for (; c < hd; ++c)
    for (int g = 0; g < NG; ++g) {
      float s = 0.f;
      for (int64_t j = 0; j < n; ++j) s += sc[g * n + j] * to_float(V[j * ld + c]);
      o[g * hd + c] = s;
    }
}

// Heads in blocks of up to 3 (register budget); a group of 3 (SmolLM2) is one block.
template <typename KV>
void attend(const float* q, const KV* K, const KV* V, int64_t G, int64_t n, int64_t hd,
            float scale, float* sc, float* o, const KvPrefetch& next, MaxSum* part) {
  for (int64_t g = 0; g < G;) {
    const int64_t nb = std::min<int64_t>(3, G - g);
    const float* qb = q + g * hd;
    float* ob = o + g * hd;
    float* sb = sc + g * n;
    const KvPrefetch* pf = g == 0 ? &next : nullptr;
    MaxSum* pb = part ? part + g : nullptr;
    if (nb == 3) attend_heads<3>(qb, K, V, n, hd, scale, sb, ob, pf, pb);
    else if (nb == 2) attend_heads<2>(qb, K, V, n, hd, scale, sb, ob, pf, pb);
    else attend_heads<1>(qb, K, V, n, hd, scale, sb, ob, pf, pb);
    g += nb;
  }
}

template void attend<float>(const float*, const float*, const float*, int64_t, int64_t, int64_t,
                            float, float*, float*, const KvPrefetch&, MaxSum*);
template void attend<uint16_t>(const float*, const uint16_t*, const uint16_t*, int64_t, int64_t,
                               int64_t, float, float*, float*, const KvPrefetch&, MaxSum*);
template void attend<int8_t>(const float*, const int8_t*, const int8_t*, int64_t, int64_t,
                             int64_t, float, float*, float*, const KvPrefetch&, MaxSum*);

void to_half(const float* x, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) out[i] = float_to_half(x[i]);
}

void rms_norm_row(const float* x, const float* w, float* out, int64_t D, float eps) {
  // Sum of squares in double (as the scalar twin) so the two ISAs agree closely.
  __m256d s0 = _mm256_setzero_pd(), s1 = s0;
  int64_t i = 0;
  for (; i + 8 <= D; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    s0 = _mm256_fmadd_pd(lo, lo, s0);
    s1 = _mm256_fmadd_pd(hi, hi, s1);
  }
  alignas(32) double t[4];
  _mm256_store_pd(t, _mm256_add_pd(s0, s1));
  double ss = (t[0] + t[1]) + (t[2] + t[3]);
  for (int64_t j = i; j < D; ++j) ss += double(x[j]) * x[j];
  const float inv = 1.0f / std::sqrt(float(ss / double(D)) + eps);
  const __m256 iv = _mm256_set1_ps(inv);
  for (i = 0; i + 8 <= D; i += 8)
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), iv),
                                            _mm256_loadu_ps(w + i)));
  for (; i < D; ++i) out[i] = x[i] * inv * w[i];
}

void swiglu(const float* g, const float* u, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i);
    const __m256 sig = _mm256_div_ps(gv, _mm256_add_ps(one, exp256(_mm256_sub_ps(zero, gv))));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(sig, _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) out[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

MaxSum exp_inplace(float* x, int64_t n) {
  __m256 mv = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
  float m = hmax(mv);
  for (int64_t j = i; j < n; ++j) m = std::fmax(m, x[j]);
  const __m256 mb = _mm256_set1_ps(m);
  __m256 sv = _mm256_setzero_ps();
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), mb));
    _mm256_storeu_ps(x + i, e);
    sv = _mm256_add_ps(sv, e);
  }
  float s = hsum(sv);
  for (; i < n; ++i) s += (x[i] = std::exp(x[i] - m));
  return {m, s};
}

void softmax_inplace(float* x, int64_t n) {
  const float s = exp_inplace(x, n).sum;
  const __m256 inv = _mm256_set1_ps(1.0f / s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
  for (; i < n; ++i) x[i] *= 1.0f / s;
}

}  // namespace sl::avx2
