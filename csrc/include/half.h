// Half / bfloat16 <-> float.
#pragma once

#include <cstdint>

namespace sl {

// Half / bfloat16 <-> float, portable. float_to_half rounds to nearest even, like F16C's
// vcvtps2ph and NumPy's astype(float16) (overflow -> inf).
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
inline float to_float(float x) { return x; }
inline float to_float(uint16_t h) { return half_to_float(h); }  // fp16 KV-cache element
inline float to_float(int8_t q) { return float(q); }             // int8 KV-cache element
inline float bf16_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

}  // namespace sl
