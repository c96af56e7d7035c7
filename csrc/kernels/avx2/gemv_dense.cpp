// Dense fp32 / fp16 / bf16 GEMV, AVX2+FMA+F16C: the shared widen-and-FMA row loop of
// kernels/avx2/simd.h with one 8-wide load per storage type (row scale 1).
#include <immintrin.h>

#include "kernels.h"
#include "kernels/avx2/simd.h"

namespace sl::avx2 {

void gemv_f32(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  gemv_float_rows<float>(w, a, y, ldy, r0, r1, [](const float* p) { return _mm256_loadu_ps(p); },
                         unit_scale);
}

void gemv_f16(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  gemv_float_rows<uint16_t>(w, a, y, ldy, r0, r1, [](const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }, unit_scale);
}

void gemv_bf16(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  gemv_float_rows<uint16_t>(w, a, y, ldy, r0, r1, [](const uint16_t* p) {
    // bf16 is the top half of an fp32: widen to 32 bits and shift into place.
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }, unit_scale);
}

}  // namespace sl::avx2
