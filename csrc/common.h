// Shared declarations of the native runtime: ISA dispatch, packed-weight descriptors and the
// per-format kernel entry points. Every kernel family lives in csrc/<family>.cpp (portable
// scalar reference) and csrc/<family>_avx2.cpp (AVX2+FMA, compiled with -mavx2 -mfma -mf16c and
// only called after the run-time CPU check in cpu.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace sl {

// ---------------------------------------------------------------------------------------------
// ISA selection and threads (cpu.cpp)
// ---------------------------------------------------------------------------------------------
enum class Isa { Scalar = 0, Avx2 = 1 };

bool cpu_supports_avx2();     // AVX2 + FMA + F16C + POPCNT, checked once with cpuid
Isa active_isa();             // what kernels dispatch to now (default: best supported)
void set_isa(const std::string& name);  // "scalar" | "avx2" | "auto"; throws if unsupported
inline bool use_avx2() { return active_isa() == Isa::Avx2; }
int num_threads();
void set_num_threads(int n);  // n <= 0 -> all cores

// All packed rows are padded to a multiple of this many columns (zeros in the weights, zeros
// in the activations) so kernels never need a tail loop. SmolLM2 / Llama widths are multiples.
constexpr int64_t kColAlign = 64;
inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// ---------------------------------------------------------------------------------------------
// Packed weight descriptor: a non-owning view of the NumPy buffers built by
// sparsellm.kernels.formats (the Python object keeps them alive). y = x @ W.T, W is (rows, cols).
// ---------------------------------------------------------------------------------------------
enum class Fmt : int {
  F32 = 0,     // data: float (rows, kp)
  F16 = 1,     // data: IEEE half (rows, kp)
  BF16 = 2,    // data: bfloat16 (rows, kp)
  I8 = 3,      // data: int8 (rows, kp); scale (rows,): w = q * scale[r]
  I4 = 4,      // data: uint8 (rows, kp/2) nibbles, see int4 layout below; scale/zero (rows, kp/G)
  SP_F32 = 5,  // bitmask sparse: mask (rows, kp/8), values float, row_off (rows+1) in elements
  SP_I8 = 6,   //   ... values int8 + scale (rows,)
  SP_I4 = 7,   //   ... values signed nibbles, row_off in bytes; scale (rows, kp/G), symmetric
  S24_I8 = 8,  // 2:4 semi-structured int8: values (rows, kp/2), meta (rows, kp/64) uint64
};

struct Weight {
  Fmt fmt = Fmt::F32;
  int64_t rows = 0, cols = 0;  // logical shape (out, in)
  int64_t kp = 0;              // padded cols, multiple of kColAlign (and of group)
  bool act_int8 = false;       // W8A8: quantize activations per token to int8, integer dots
  int group = 0;               // int4 group size (32/64/128)
  bool asym = false;           // int4 with zero points
  const void* data = nullptr;
  const float* scale = nullptr;
  const uint8_t* zero = nullptr;     // I4 asym: (rows, kp/G) zero points 0..15
  const uint8_t* mask = nullptr;     // SP_*: (rows, kp/8), bit j of byte b <-> column 8b+j
  const int64_t* row_off = nullptr;  // SP_*: (rows+1,) start of each row's packed values
  const uint64_t* meta = nullptr;    // S24_I8: (rows, kp/64) 2-bit selectors, see sparse24
};

// Int4 layout: a row is kp/32 blocks of 16 bytes; byte j of a block holds value j in its low
// nibble and value j+16 in its high nibble (llama.cpp Q4_0 order), so one AVX2 and/shift turns
// a block into 32 bytes in column order. Stored q is unsigned 0..15; w = (q - z) * s with z = 8
// for symmetric groups.

// Per-token activation view handed to GEMV kernels (all arrays padded to kp).
struct Act {
  const float* x = nullptr;    // (kp,) fp32, zero padded
  const int8_t* xq = nullptr;  // (kp,) int8 for act_int8 formats
  float xscale = 0.f;          // x ~= xq * xscale
  const float* gsum = nullptr; // (kp/G,) sum of x (or of xq for W4A8) over each int4 group
};

// ---------------------------------------------------------------------------------------------
// Kernel entry points. gemv_*: y[r] = dot(W[r], x) for r in [r0, r1) (single token).
// decode_rows: dequantize rows [r0, r1) into out (r1-r0, kp) fp32 (GEMM panels); portable,
// in gemv_sparse.cpp next to the bitmask / 2:4 walkers it shares; its cost is amortized over T.
// ---------------------------------------------------------------------------------------------
namespace scalar {
void gemv_f32(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1);
void gemv_f16(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1);
void gemv_bf16(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1);
void gemv_i8(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1);
void gemv_i8a8(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1);
void gemv_i4(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1);
void gemv_i4a8(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1);
void gemv_sp_f32(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1);
void gemv_sp_i8(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1);
void gemv_sp_i8a8(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1);
void gemv_sp_i4(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1);
void gemv_s24_i8a8(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1);
void gemv_s24_i8(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1);
void decode_rows(const Weight& w, int64_t r0, int64_t r1, float* out);
// Y[t, r] = dot(W[r], X[t]) for a panel of nr rows and T tokens.
void panel_gemm(const float* W, int64_t ldw, int64_t nr, const float* X, int64_t ldx, int64_t T,
                int64_t k, float* Y, int64_t ldy);
void quantize_row(const float* x, int64_t n, int8_t* q, float* scale);
}  // namespace scalar

namespace avx2 {
void gemv_f32(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1);
void gemv_f16(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1);
void gemv_bf16(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1);
void gemv_i8(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1);
void gemv_i8a8(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1);
void gemv_i4(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1);
void gemv_i4a8(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1);
void gemv_sp_f32(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1);
void gemv_sp_i8(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1);
void gemv_sp_i8a8(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1);
void gemv_sp_i4(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1);
void gemv_s24_i8a8(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1);
void gemv_s24_i8(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1);
void panel_gemm(const float* W, int64_t ldw, int64_t nr, const float* X, int64_t ldx, int64_t T,
                int64_t k, float* Y, int64_t ldy);
void quantize_row(const float* x, int64_t n, int8_t* q, float* scale);
}  // namespace avx2

// Half / bfloat16 <-> float, portable.
float half_to_float(uint16_t h);
inline float bf16_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

}  // namespace sl
