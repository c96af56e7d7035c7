// Format traits: one row per Fmt, everything the runtime knows about a format (in the spirit of
// ggml's per-type traits table). make_weight (python/) validates a weight from its row,
// linear() dispatches through it (runtime/linear.cpp), and Python reads it through
// _native.weight_formats() (a test checks it against kernels/layouts.py's declarations).
#pragma once

#include <cstdint>

#include "isa.h"
#include "kernels.h"
#include "weight.h"

namespace sl {

using GemvFn = void (*)(const Weight&, const Acts&, float*, int64_t, int64_t, int64_t);
using DecodeRowsFn = void (*)(const Weight&, int64_t, int64_t, float*);

// A GEMV kernel, and whether it reads Acts::gsum (per-group sums of the activations) and
// Acts::xw (the int8 codes widened to int16). group_int8: a weight-only format's kernel on x
// quantized per weight group (LinearScratch::group_int8, linear.h), where there is one.
struct Gemv {
  GemvFn fn = nullptr;
  bool group_sums = false;
  bool int16_codes = false;
  GemvFn group_int8 = nullptr;
};
constexpr bool kGroupSums = true, kInt16Codes = true;

// Largest T a format's GEMV serves (above: a GEMM, linear.h): the crossovers that
// `python -m sparsellm.kernels.bench --tokens 1,2,4,5,8,16,32,64,128` finds (GEMV time / GEMM
// time, SmolLM2-135M shapes, 2 threads). Against the fp32 GEMM over decoded panels, fp32
// activations' GEMVs win up to T = 8; int8 activations with per-channel int8 weights win at
// every T, so on the portable path they never leave the GEMV; int4_g32_a8 at up to T = 32.
// With AVX-512, int8 activations (and weight-only int4 prompts) go to the int8 GEMM
// (kernels/avx512/gemm_int.cpp) above avx512_max_tokens (the same bits as the GEMV where the scales
// are per row and per token); sparse int4 W4A8 and 2:4 W8A8 lose to it already at 8, where the
// batch-of-8 decode still stays on the GEMV (bitwise equal to T == 1).
constexpr int64_t kGemvMaxTokensF32 = 8, kGemvMaxTokensI4A8 = 32, kGemvAlways = INT64_MAX;
constexpr int64_t kGemvMaxTokensW8A8Vnni = 40, kGemvMaxTokensSparseW8A8Vnni = 24,
                  kGemvMaxTokensVnni = 8;
// On AVX2 they go to the integer GEMMs (W8A8: kernels/avx2/gemm.cpp panel_gemm_codes; int4:
// kernels/avx2/gemm_int.cpp) above avx2_max_tokens, the crossovers of the same measurement on an
// AVX2-only AMD EPYC (Zen 1; for W8A8 also at TinyLlama-1.1B shapes, and the same bits either
// way).
constexpr int64_t kGemvMaxTokensW8A8Madd = 16, kGemvMaxTokensSparseW8A8Madd = 32,
                  kGemvMaxTokensS24W8A8Madd = 32, kGemvMaxTokensSparseW4A8Madd = 8,
                  kGemvMaxTokensI4A8Madd = 16;

// A format's GEMVs for one type of activations: per ISA (avx512 {}: the AVX2 kernel runs on
// AVX-512 machines too), and the largest T they serve (avx2_max_tokens / avx512_max_tokens, if
// set, on those machines: where an integer GEMM takes over). scalar.fn == nullptr: the format
// does not run with these activations.
struct GemvSet {
  Gemv scalar, avx2, avx512;
  int64_t max_tokens = 0;
  int64_t avx2_max_tokens = 0;
  int64_t avx512_max_tokens = 0;
  constexpr bool runs() const { return scalar.fn != nullptr; }
};

enum class Sparsity { Dense, Bitmask, TwoFour };

// A sparsity's name, as Python's weight_format.py Sparsity spells it (compressed-tensors'
// sparsity_structure names); nullptr for dense.
constexpr const char* sparsity_name(Sparsity s) {
  return s == Sparsity::Bitmask ? "unstructured" : s == Sparsity::TwoFour ? "2:4" : nullptr;
}

struct FmtTraits {
  Fmt fmt;
  const char* name;      // the Fmt's name (what kernels/layouts.py Layout.native_format says)
  int value_bits;        // bits of one stored weight value
  bool is_float;         // float values; else integers times per-row or per-group scales
  Sparsity sparsity;     // Bitmask: mask + row_off; TwoFour: meta
  bool grouped;          // group scales: Weight::group a multiple of 32 that divides kp
  bool asym;             // may have zero points (Weight::asym, zero)
  GemvSet fp32_acts;     // GEMVs on fp32 activations
  GemvSet int8_acts;     // GEMVs on per-token int8 activations (W8A8 / W4A8)
  DecodeRowsFn decode_rows;
  DecodeRowsFn decode_rows_avx2 = nullptr;    // the same values, faster, where there is one
  DecodeRowsFn decode_rows_avx512 = nullptr;
  int superblock = 0;    // columns per superblock of group scales (I4K: kSuperblock), kp's unit
  constexpr const GemvSet& gemvs(bool act_int8) const { return act_int8 ? int8_acts : fp32_acts; }
};

// clang-format off
inline constexpr FmtTraits kFmtTraits[] = {
  // fmt, name, value bits, float, sparsity, grouped, asym
  //   fp32 activations {scalar, avx2, avx512, max tokens}, int8 activations {...}, decode_rows
  //   (and its AVX2 and AVX-512 twins, if any)
  {Fmt::F32, "F32", 32, true, Sparsity::Dense, false, false,
   {{scalar::gemv_f32}, {avx2::gemv_f32}, {}, kGemvMaxTokensF32}, {},
   scalar::decode_rows_f32},
  {Fmt::F16, "F16", 16, true, Sparsity::Dense, false, false,
   {{scalar::gemv_f16}, {avx2::gemv_f16}, {}, kGemvMaxTokensF32}, {},
   scalar::decode_rows_f16},
  {Fmt::BF16, "BF16", 16, true, Sparsity::Dense, false, false,
   {{scalar::gemv_bf16}, {avx2::gemv_bf16}, {}, kGemvMaxTokensF32}, {},
   scalar::decode_rows_bf16},
  {Fmt::I8, "I8", 8, false, Sparsity::Dense, false, false,
   {{scalar::gemv_i8}, {avx2::gemv_i8, !kGroupSums, !kInt16Codes, avx2::gemv_i8_xg},
    {avx512::gemv_i8}, kGemvMaxTokensF32}, {},
   scalar::decode_rows_i8},
  {Fmt::I4, "I4", 4, false, Sparsity::Dense, true, true,
   {{scalar::gemv_i4, kGroupSums}, {avx2::gemv_i4, kGroupSums, !kInt16Codes, avx2::gemv_i4_xg},
    {avx512::gemv_i4},
    kGemvMaxTokensF32},
   {{scalar::gemv_i4a8, kGroupSums}, {avx2::gemv_i4a8, kGroupSums}, {avx512::gemv_i4a8, kGroupSums},
    kGemvMaxTokensI4A8, kGemvMaxTokensI4A8Madd, kGemvMaxTokensVnni},
   scalar::decode_rows_i4},
  {Fmt::SP_F32, "SP_F32", 32, true, Sparsity::Bitmask, false, false,
   {{scalar::gemv_sp_f32}, {avx2::gemv_sp_f32}, {avx512::gemv_sp_f32}, kGemvMaxTokensF32}, {},
   scalar::decode_rows_sp_f32, avx2::decode_rows_sp_f32, avx512::decode_rows_sp_f32},
  {Fmt::SP_I8, "SP_I8", 8, false, Sparsity::Bitmask, false, false,
   {{scalar::gemv_sp_i8}, {avx2::gemv_sp_i8}, {avx512::gemv_sp_i8}, kGemvMaxTokensF32},
   {{scalar::gemv_sp_i8a8}, {avx2::gemv_sp_i8a8, !kGroupSums, kInt16Codes},
    {avx512::gemv_sp_i8a8}, kGemvAlways,
    kGemvMaxTokensSparseW8A8Madd, kGemvMaxTokensSparseW8A8Vnni},
   scalar::decode_rows_sp_i8, avx2::decode_rows_sp_i8, avx512::decode_rows_sp_i8},
  {Fmt::SP_I4, "SP_I4", 4, false, Sparsity::Bitmask, true, false,
   {{scalar::gemv_sp_i4}, {avx2::gemv_sp_i4}, {avx512::gemv_sp_i4}, kGemvMaxTokensF32},
   {{scalar::gemv_sp_i4a8}, {avx2::gemv_sp_i4a8, !kGroupSums, kInt16Codes},
    {avx512::gemv_sp_i4a8, kGroupSums},
    kGemvAlways, kGemvMaxTokensSparseW4A8Madd, kGemvMaxTokensVnni},
   scalar::decode_rows_sp_i4},
  {Fmt::S24_I8, "S24_I8", 8, false, Sparsity::TwoFour, false, false,
   {{scalar::gemv_s24_i8}, {avx2::gemv_s24_i8}, {avx512::gemv_s24_i8}, kGemvMaxTokensF32},
   {{scalar::gemv_s24_i8a8}, {avx2::gemv_s24_i8a8}, {avx512::gemv_s24_i8a8}, kGemvAlways,
    kGemvMaxTokensS24W8A8Madd, kGemvMaxTokensVnni},
   scalar::decode_rows_s24_i8, avx2::decode_rows_s24_i8},
  {Fmt::I8_R16, "I8_R16", 8, false, Sparsity::Dense, false, false,
   {},
   {{scalar::gemv_i8a8}, {avx2::gemv_i8a8}, {avx512::gemv_i8a8}, kGemvAlways,
    kGemvMaxTokensW8A8Madd, kGemvMaxTokensW8A8Vnni},
   scalar::decode_rows_i8_r16},
  // Q4_K's form (weight.h): I4's kernels with the superblocks' scales (AVX-512 runs the AVX2
  // ones; its prompts take the fp32 GEMM over decoded rows, int_gemm_act_group).
  {Fmt::I4K, "I4K", 4, false, Sparsity::Dense, true, false,
   {{scalar::gemv_i4k, kGroupSums}, {avx2::gemv_i4k, kGroupSums, !kInt16Codes, avx2::gemv_i4k_xg},
    {}, kGemvMaxTokensF32},
   {{scalar::gemv_i4ka8, kGroupSums}, {avx2::gemv_i4ka8, kGroupSums}, {},
    kGemvMaxTokensI4A8, kGemvMaxTokensI4A8Madd},
   scalar::decode_rows_i4k, nullptr, nullptr, kSuperblock},
};
// clang-format on

constexpr bool fmt_traits_in_enum_order() {
  int i = 0;
  for (const FmtTraits& t : kFmtTraits)
    if (int(t.fmt) != i++) return false;
  return i == int(Fmt::Count);
}
static_assert(fmt_traits_in_enum_order(), "kFmtTraits: one row per Fmt, in the enum's order");

inline const FmtTraits& fmt_traits(Fmt f) { return kFmtTraits[int(f)]; }

// Int4 values, dense or bitmask (the formats the AVX2 int4 byte GEMM multiplies).
inline bool is_int4(Fmt f) { return fmt_traits(f).value_bits == 4; }

// A weight's scales per row: one per int4 group, else one (w.scale is (rows, scale_groups)).
inline int64_t scale_groups(const Weight& w) {
  return fmt_traits(w.fmt).grouped ? w.kp / w.group : 1;
}

// Dequantize rows [r0, r1) of any format into out (r1-r0, kp) fp32 (the same values on every
// ISA: a SIMD decoder is only faster).
inline void decode_rows(const Weight& w, int64_t r0, int64_t r1, float* out) {
  const FmtTraits& t = fmt_traits(w.fmt);
  const DecodeRowsFn fn = use_avx512() && t.decode_rows_avx512 ? t.decode_rows_avx512
                          : use_avx2() && t.decode_rows_avx2   ? t.decode_rows_avx2
                                                               : t.decode_rows;
  fn(w, r0, r1, out);
}

// Dynamic symmetric int8 of one row (W8A8 activations, int8 KV-cache rows) on the active ISA;
// the AVX2 twin takes 32 values at a time, so other lengths go to the (identical) scalar one.
inline void quantize_int8_row(const float* x, int64_t n, int8_t* q, float* scale) {
  if (use_avx2() && n % 32 == 0) avx2::quantize_row(x, n, q, scale);
  else scalar::quantize_row(x, n, q, scale);
}

}  // namespace sl
