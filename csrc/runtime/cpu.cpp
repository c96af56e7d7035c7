// Run-time ISA detection and selection, half-float conversion.
#include <atomic>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "isa.h"
#include "half.h"

namespace sl {

bool cpu_supports_avx2() {
  // __builtin_cpu_supports reads cpuid once (and honours OS support of the YMM state).
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("popcnt") && __builtin_cpu_supports("f16c");
  }();
  return ok;
}

bool cpu_supports_avx512() {
  static const bool ok = [] {
    __builtin_cpu_init();  // also checks that the OS saves the ZMM state
    return cpu_supports_avx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi") &&
           __builtin_cpu_supports("avx512vbmi2");
  }();
  return ok;
}

bool prefetch_single_stream() {
  static const bool on = [] {
    __builtin_cpu_init();
    return !(__builtin_cpu_is("amd") && cpu_supports_avx512());  // off from Zen 4 (tiles.h)
  }();
  return on;
}

static Isa best_isa() {
  return cpu_supports_avx512() ? Isa::Avx512 : cpu_supports_avx2() ? Isa::Avx2 : Isa::Scalar;
}

static std::atomic<int> g_isa{-1};

Isa active_isa() {
  int v = g_isa.load(std::memory_order_relaxed);
  if (v < 0) {
    v = int(best_isa());
    g_isa.store(v, std::memory_order_relaxed);
  }
  return Isa(v);
}

void set_isa(const std::string& name) {
  if (name == "scalar") {
    g_isa = int(Isa::Scalar);
  } else if (name == "avx2") {
    if (!cpu_supports_avx2())
      throw std::runtime_error("set_isa('avx2'): this CPU lacks AVX2/FMA/F16C; use 'scalar'");
    g_isa = int(Isa::Avx2);
  } else if (name == "avx512") {
    if (!cpu_supports_avx512())
      throw std::runtime_error(
          "set_isa('avx512'): this CPU lacks AVX512 F/BW/VL/VNNI/VBMI/VBMI2; use 'avx2' or "
          "'scalar'");
    g_isa = int(Isa::Avx512);
  } else if (name == "auto") {
    g_isa = int(best_isa());
  } else {
    throw std::invalid_argument("set_isa: unknown ISA '" + name +
                                "'; accepted: 'scalar', 'avx2', 'avx512', 'auto'");
  }
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000);
  x &= 0x7fffffff;
  if (x > 0x7f800000) return sign | 0x7e00 | uint16_t((x >> 13) & 0x3ff);  // NaN, made quiet
  if (x >= 0x477ff000) return sign | 0x7c00;  // >= 65520 rounds to inf (and inf)
  if (x < 0x38800000) {  // below 2^-14: a subnormal half in units of 2^-24 (exact product)
    float a;
    std::memcpy(&a, &x, 4);
    return sign | uint16_t(std::nearbyint(a * 16777216.0f));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to even; a
  // carry into the exponent is the correct rounding.
  return sign | uint16_t((x - 0x38000000 + 0xfff + ((x >> 13) & 1)) >> 13);
}

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: renormalize
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) {
        man <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000 | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace sl
