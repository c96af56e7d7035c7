// Transformer ops, AVX2+FMA twins of ops.cpp's scalar reference (same math, vectorized).
#include <immintrin.h>

#include <cmath>

#include "ops.h"
#include "simd_avx2.h"

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

// o[c, c + 8 * NV) = sum_j sc[j] * V[j, c, c + 8 * NV): the output columns stay in registers
// over all keys (an axpy per key loaded and stored them for every key, and was ~8% of a
// batch-8 decode step). A 64-wide head takes one pass of 8 accumulators: two passes of 4 were
// bound by the FMA latency (4 chains, one FMA per key each); 1.04-1.22x for 30 layers of 8
// tokens x 500 keys, same results bit for bit.
template <int NV, typename KV>
static inline void weighted_sum(const float* sc, const KV* V, int64_t n, int64_t hd, float* o) {
  __m256 acc[NV];
  for (int i = 0; i < NV; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    const __m256 s = _mm256_broadcast_ss(sc + j);
    for (int i = 0; i < NV; ++i) acc[i] = _mm256_fmadd_ps(s, load8(V + j * hd + 8 * i), acc[i]);
  }
  for (int i = 0; i < NV; ++i) _mm256_storeu_ps(o + 8 * i, acc[i]);
}

template <typename KV>
void attend(const float* q, const KV* K, const KV* V, int64_t n, int64_t hd, float scale,
            float* sc, float* o) {
  for (int64_t j = 0; j < n; ++j) sc[j] = dot(q, K + j * hd, hd) * scale;
  softmax_inplace(sc, n);
  int64_t c = 0;
  for (; c + 64 <= hd; c += 64) weighted_sum<8>(sc, V + c, n, hd, o + c);
  for (; c + 32 <= hd; c += 32) weighted_sum<4>(sc, V + c, n, hd, o + c);
  for (; c + 8 <= hd; c += 8) weighted_sum<1>(sc, V + c, n, hd, o + c);
  for (; c < hd; ++c) {
    float s = 0.f;
    for (int64_t j = 0; j < n; ++j) s += sc[j] * to_float(V[j * hd + c]);
    o[c] = s;
  }
}

template void attend<float>(const float*, const float*, const float*, int64_t, int64_t, float,
                            float*, float*);
template void attend<uint16_t>(const float*, const uint16_t*, const uint16_t*, int64_t, int64_t,
                               float, float*, float*);

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

void softmax_inplace(float* x, int64_t n) {
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
  const __m256 inv = _mm256_set1_ps(1.0f / s);
  for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
  for (; i < n; ++i) x[i] *= 1.0f / s;
}

}  // namespace sl::avx2
