// Shared declarations of the native runtime: ISA dispatch, packed-weight descriptors and the
// per-format kernel entry points. Every kernel family lives in csrc/<family>.cpp (portable
// scalar reference) and csrc/<family>_avx2.cpp (AVX2+FMA, compiled with -mavx2 -mfma -mf16c and
// only called after the run-time CPU check in cpu.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

// Fully unrolls the loop that follows. GCC 12 keeps an array of SIMD accumulators in registers
// only if the loops that zero and read it are unrolled before its scalar replacement pass; with
// those left rolled, attention's weighted sums stored all 12 accumulators to the stack on every
// key (and reloaded them), a third of their time.
#define SL_UNROLL _Pragma("GCC unroll 16")

namespace sl {

// ---------------------------------------------------------------------------------------------
// ISA selection (cpu.cpp; threads: threads.h)
// ---------------------------------------------------------------------------------------------
// Avx512 adds the W8A8 (dense, bitmask, 2:4), dense int4 (W4A16, W4A8) and sparse int4 kernels
// of gemv_avx512.cpp, weight-only int8 (dense, bitmask, 2:4) and bitmask fp32 of
// gemv_float_avx512.cpp, the GEMMs of gemm_avx512.cpp / gemm_int8_avx512.cpp /
// gemm_sparse_avx512.cpp and the row decoders of decode_avx512.cpp to the AVX2 set (every
// other kernel stays AVX2 there); it implies AVX2.
enum class Isa { Scalar = 0, Avx2 = 1, Avx512 = 2 };

bool cpu_supports_avx2();     // AVX2 + FMA + F16C + POPCNT, checked once with cpuid
bool cpu_supports_avx512();   // AVX2 set + AVX512 F/BW/VL/VNNI/VBMI/VBMI2
Isa active_isa();             // what kernels dispatch to now (default: best supported)
bool prefetch_single_stream();  // software prefetch for one token's weight stream (tiles.h)
void set_isa(const std::string& name);  // "scalar" | "avx2" | "avx512" | "auto"; throws if unsupported
inline bool use_avx2() { return active_isa() >= Isa::Avx2; }
inline bool use_avx512() { return active_isa() == Isa::Avx512; }

// All packed rows are padded to a multiple of this many columns (zeros in the weights, zeros
// in the activations) so kernels never need a tail loop. SmolLM2 / Llama widths are multiples.
constexpr int64_t kColAlign = 64;

// Vectors of run-time buffers (activations, scores) start on a cache line, so with rows padded
// to kColAlign columns a kernel's 64-byte load never straddles two lines (on the 16-byte
// boundary malloc gives, the W8A8 kernels' activation loads split, and speed depended on where
// a process's buffer happened to land).
template <class T>
struct CacheAligned {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  CacheAligned() = default;
  template <class U>
  CacheAligned(const CacheAligned<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kAlign); }
  template <class U>
  bool operator==(const CacheAligned<U>&) const { return true; }
  template <class U>
  bool operator!=(const CacheAligned<U>&) const { return false; }
};
template <class T>
using AlignedVector = std::vector<T, CacheAligned<T>>;

// Whether F, a kernel template's per-vector callable, is a closure object the kernel inlines. A
// function passed as one decays to a pointer, called per step, which no test of the values
// notices but makes a kernel several times slower. Kernels static_assert it.
template <class... F>
inline constexpr bool inlined_callables = (!std::is_pointer_v<F> && ...);

// ---------------------------------------------------------------------------------------------
// Packed weight descriptor: a non-owning view of the NumPy buffers built by
// sparsellm.kernels.formats (the Python object keeps them alive). y = x @ W.T, W is (rows, cols).
// ---------------------------------------------------------------------------------------------
// One id per packed layout; everything else about a format is its row of kFmtTraits below.
enum class Fmt : int {
  F32,     // data: float (rows, kp)
  F16,     // data: IEEE half (rows, kp)
  BF16,    // data: bfloat16 (rows, kp)
  I8,      // data: int8 (rows, kp); scale (rows,): w = q * scale[r] (W8A16)
  I4,      // data: uint8 (rows, kp/2) nibbles, see int4 layout below; scale/zero (rows, kp/G)
  SP_F32,  // bitmask sparse: mask (rows, kp/8), values float, row_off (rows+1) in elements
  SP_I8,   //   ... values int8 + scale (rows,)
  SP_I4,   //   ... values signed nibbles, row_off in bytes; scale (rows, kp/G), symmetric
  S24_I8,  // 2:4 semi-structured int8: values (rows, kp/2), meta (rows, kp/64) uint64
  I8_R16,  // dense int8 for W8A8 in blocks of 16 rows, see kRowBlock16 below
  Count,
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

// I8_R16: rows padded to a multiple of 16 (zero rows, zero scales); block b (rows 16b..16b+15)
// is 16 * kp bytes at data + 16 * kp * b, and holds columns 4j..4j+3 of its 16 rows as the 64
// bytes at 64 j, row by row (16 x 4). One vpdpbusd multiplies those 64 bytes by 4 activations
// broadcast to every lane, so the 16 lanes accumulate the 16 rows' dot products: no horizontal
// sums, and a block's results are stored as one vector. (The row-major int8 layout needs a
// transposing add tree per row and token, which was a third of a batched W8A8 row's work.)
// The threads split rows in blocks: every GEMV call's r0 is a multiple of 16.
constexpr int64_t kRowBlock16 = 16;
inline int64_t row_blocks16(int64_t rows) { return (rows + kRowBlock16 - 1) / kRowBlock16; }
inline const int8_t* r16_block(const Weight& w, int64_t b) {
  return static_cast<const int8_t*>(w.data) + b * kRowBlock16 * w.kp;
}

// Calls f(std::integral_constant<int, G>{}) for the weight's int4 group size: the int4 kernels
// take it as a compile-time constant (read at run time, it costs the sparse W4A8 loop a reload
// and two compares per word, and the dense ones a division per step).
template <class F>
inline void with_group(int group, F&& f) {
  if (group == 32) return f(std::integral_constant<int, 32>{});
  if (group == 64) return f(std::integral_constant<int, 64>{});
  f(std::integral_constant<int, 128>{});
}

// 2:4 (S24_I8) value order inside a 64-column block: slot s holds the kept values of the
// 16-column chunk kSlotChunk[s] (see gemv_sparse.cpp; the AVX2 kernel gathers x by it).
constexpr int kSlotChunk[4] = {0, 2, 1, 3};
// Value i = 8s + b of a block (the b-th kept value of slot s): its 2-bit selector is at bit
// s24_selector_bit(i) of the block's meta word, and it sits in column s24_group_column(i) +
// selector (its group's first column plus the selector).
constexpr int s24_selector_bit(int i) { return 8 * (i % 8) + 2 * (i / 8); }
constexpr int s24_group_column(int i) { return 16 * kSlotChunk[i / 8] + 4 * (i % 8 / 2); }

// Bitmask int4 (SP_I4): the nibbles of each 64-column mask word start on a byte, so a walk
// over a row's nibble stream rounds its index p up to even at every word, and a word of n
// values takes sp_i4_word_bytes(n) bytes.
inline int64_t sp_i4_word_start(int64_t p) { return (p + 1) & ~int64_t(1); }
inline int64_t sp_i4_word_bytes(int n) { return (n + 1) / 2; }
// End of a bitmask row's last mask word holding real columns. Padding kp to a group of 128 adds
// a whole empty word to 576-column rows (10 words for 9): the sparse int4 kernels stop here.
inline int64_t words_end(const Weight& w) { return (w.cols + 63) & ~int64_t(63); }

// Int4 layout: a row is kp/32 blocks of 16 bytes; byte j of a block holds value j in its low
// nibble and value j+16 in its high nibble (llama.cpp Q4_0 order), so one AVX2 and/shift turns
// a block into 32 bytes in column order. Stored q is unsigned 0..15; w = (q - z) * s with z = 8
// for symmetric groups.

// Activations of a small batch of T tokens handed to the kernels. Every row is padded to kp
// (zeros), so row t of x / xq starts at t * kp; one kernel call multiplies each weight row it
// owns with all T tokens, reading the packed row from DRAM once (decode: T == 1; batched decode
// and speculative verification: a few tokens).
struct Acts {
  int64_t T = 1;
  const float* x = nullptr;       // (T, kp) fp32
  const int8_t* xq = nullptr;     // (T, kp) int8, act_int8 formats only
  const float* xscale = nullptr;  // (T,) x[t] ~= xq[t] * xscale[t]
  const int32_t* xsum = nullptr;  // (T,) sum of xq[t], act_int8 formats only
  const int16_t* xw = nullptr;    // (T, kp) xq widened to int16, for Gemv::int16_codes kernels
  const float* xgscale = nullptr; // (T, kp/group) xq's scales per weight group (Gemv::group_int8)
  const float* gsum = nullptr;    // (T, kp/group) I4, and SP_I4 W4A8 on AVX-512: per-group
                                  // sums of x (xq for W4A8)
};

// Activations of the integer GEMMs of prefill (AVX-512 int8, AVX2 int16 / int8): x's int8
// codes, (T, kp), and their scales, per token (W8A8, W4A8: the GEMV's xq / xscale) or per group
// of columns, (T, kp / group) (weight-only formats: quantized for the GEMM alone,
// int_gemm_act_group).
struct GemmActs {
  int64_t T = 0;
  const uint8_t* xu = nullptr;   // AVX-512: codes + 128
  const int16_t* xw = nullptr;   // AVX2 int16 kernel: codes as int16 (W8A8, W4A8 only)
  const int8_t* xq = nullptr;    // AVX2 int4 kernel: the codes
  const float* gsum = nullptr;   // AVX2 int4 kernel: (T, kp / 32) sums of the codes
  const float* xs = nullptr;
};
// Columns per activation scale of the integer GEMM on the active ISA: 0 for W8A8 / W4A8 (per
// token), else a weight-only prompt's x quantized per group (AVX-512: int4 the weight's group,
// int8 32, a Q8_0 block; AVX2: dense int4 only, its weight's group); -1 where no integer GEMM
// runs: float weights, the portable path, the other weight-only formats on AVX2 (linear.cpp).
int64_t int_gemm_act_group(const Weight& w);

// The rows [r0, r0 + nr) of w that a panel GEMM packs, as fp32: fp32 weights in place, any other
// format decoded (decode_rows) by the GEMM a group of rows at a time, into a buffer that stays in
// L2 while it packs them, rather than the whole 48-row panel first (up to 1 MB) read back from
// further away.
struct PanelRows {
  const Weight& w;
  int64_t r0, nr;
  // Rows r0 + i .. r0 + i + n (i + n <= nr) with stride w.kp: in place, or decoded into buf
  // (n * w.kp floats). Out of line (linear.cpp): portable code.
  const float* rows(int64_t i, int64_t n, float* buf) const;
};

// ---------------------------------------------------------------------------------------------
// Kernel entry points. gemv_*: y[t * ldy + r] = dot(W[r], x[t]) for rows r in [r0, r1) and all
// T tokens. Each token's result is bitwise the same whatever T and whichever other tokens share
// the call: every kernel walks a row in one fixed order and keeps separate accumulators per token
// (tiles.h), so batching sequences or verifying drafted tokens never changes a logit.
// decode_rows_<format>: dequantize rows [r0, r1) into out (r1-r0, kp) fp32 (GEMM panels,
// embedding lookups); portable, in gemv_sparse.cpp next to the bitmask / 2:4 walkers they share;
// their cost is amortized over T.
// ---------------------------------------------------------------------------------------------
#define SL_GEMV_KERNELS(X) \
  X(f32) X(f16) X(bf16) X(i8) X(i8a8) X(i4) X(i4a8) X(sp_f32) X(sp_i8) X(sp_i8a8) X(sp_i4) \
  X(sp_i4a8) X(s24_i8) X(s24_i8a8)
#define SL_DECODE_ROWS(X) \
  X(f32) X(f16) X(bf16) X(i8) X(i8_r16) X(i4) X(sp_f32) X(sp_i8) X(sp_i4) X(s24_i8)
#define SL_DECLARE_GEMV(name) \
  void gemv_##name(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
#define SL_DECLARE_DECODE_ROWS(name) \
  void decode_rows_##name(const Weight& w, int64_t r0, int64_t r1, float* out);

namespace scalar {
SL_GEMV_KERNELS(SL_DECLARE_GEMV)
SL_DECODE_ROWS(SL_DECLARE_DECODE_ROWS)
// Y[t, r] = dot(W[r], X[t]) for a panel of W.nr <= kPanelRows rows and T tokens (k = W.w.kp).
void panel_gemm(const PanelRows& W, const float* X, int64_t ldx, int64_t T, float* Y,
                int64_t ldy);
void quantize_row(const float* x, int64_t n, int8_t* q, float* scale);
}  // namespace scalar

namespace avx2 {
SL_GEMV_KERNELS(SL_DECLARE_GEMV)
void panel_gemm(const PanelRows& W, const float* X, int64_t ldx, int64_t T, float* Y,
                int64_t ldy);
void quantize_row(const float* x, int64_t n, int8_t* q, float* scale);
// The integer GEMM of prefill (gemm_int_avx2.cpp) for the int8-activation formats (W8A8, W4A8)
// and, in a prompt, weight-only int4 (dense, bitmask): y[t * ldy + r] for rows [r0, r1), r0 a
// multiple of 16, from GemmActs::xw (int16 kernel) or xq and gsum (int4).
void int_gemm(const Weight& w, const GemmActs& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
// Its activations: quantize_row's codes per token (W8A8, W4A8) or weight-only int4's per group
// (quantize_groups), widened to int16 for the int16 kernel (widen_codes; n a multiple of 16).
void widen_codes(const int8_t* q, int64_t n, int16_t* xw);
void quantize_groups(const float* x, int64_t kp, int64_t group, int8_t* q, float* xs);
// Weight-only int4 on x quantized per weight group (xq, xgscale; gsum: each group's code sum
// times its scale): the W4A8 kernel with per-group activation scales (Gemv::group_int8).
void gemv_i4_xg(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
// Weight-only int8 on x quantized per 32 columns (Gemv::group_int8).
void gemv_i8_xg(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
void decode_rows_sp_f32(const Weight& w, int64_t r0, int64_t r1, float* out);
void decode_rows_sp_i8(const Weight& w, int64_t r0, int64_t r1, float* out);
}  // namespace avx2

namespace avx512 {
void decode_rows_sp_f32(const Weight& w, int64_t r0, int64_t r1, float* out);
void decode_rows_sp_i8(const Weight& w, int64_t r0, int64_t r1, float* out);
// Weights widened to fp32 against fp32 activations (gemv_float_avx512.cpp).
void gemv_i8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
void gemv_sp_i8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
void gemv_sp_f32(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
void gemv_s24_i8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
void panel_gemm(const PanelRows& W, const float* X, int64_t ldx, int64_t T, float* Y,
                int64_t ldy);
void gemv_i4(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
void gemv_i4a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
void gemv_i8a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
void gemv_sp_i8a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
void gemv_s24_i8a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
void gemv_sp_i4(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
void gemv_sp_i4a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
// The bitmask fp32 GEMM of prefill (gemm_sparse_avx512.cpp), kept weights only:
// transpose_tokens lays x (T, kp) out k-major in tiles of kSparseTile tokens, xt
// (ceil(T / kSparseTile), kp, kSparseTile), lanes past T zero; sp_f32_gemm computes
// y[t * ldy + r] for rows [r0, r1) from it.
constexpr int64_t kSparseTile = 128;
void transpose_tokens(const float* x, int64_t T, int64_t kp, float* xt);
void sp_f32_gemm(const Weight& w, const float* xt, int64_t T, float* y, int64_t ldy, int64_t r0,
                 int64_t r1);
// The int8 GEMM of prefill (gemm_int8_avx512.cpp) for every integer format (weight-only ones
// for prompts): y[t * ldy + r] for rows [r0, r1), r0 a multiple of 32.
void int8_gemm(const Weight& w, const GemmActs& a, float* y, int64_t ldy, int64_t r0, int64_t r1);
// Weight-only formats' activations for it, per int_gemm_act_group columns.
void quantize_groups(const float* x, int64_t kp, int64_t group, uint8_t* xu, float* xs);
// quantize_int8_row's codes + 128 (W8A8 / W4A8 activations for it); n a multiple of 16.
void quantize_row_u8(const float* x, int64_t n, uint8_t* xu, float* scale);
}  // namespace avx512

// ---------------------------------------------------------------------------------------------
// Format traits: one row per Fmt, everything the runtime knows about a format (in the spirit of
// ggml's per-type traits table). make_weight (module.cpp) validates a weight from its row,
// linear() dispatches through it (linear.cpp), and Python reads it through
// _native.weight_formats() (a test checks it against kernels/layouts.py's declarations).
// ---------------------------------------------------------------------------------------------
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
// (gemm_int8_avx512.cpp) above avx512_max_tokens (the same bits as the GEMV where the scales
// are per row and per token); sparse int4 W4A8 and 2:4 W8A8 lose to it already at 8, where the
// batch-of-8 decode still stays on the GEMV (bitwise equal to T == 1).
constexpr int64_t kGemvMaxTokensF32 = 8, kGemvMaxTokensI4A8 = 32, kGemvAlways = INT64_MAX;
constexpr int64_t kGemvMaxTokensW8A8Vnni = 40, kGemvMaxTokensSparseW8A8Vnni = 24,
                  kGemvMaxTokensVnni = 8;
// On AVX2 they go to the int16 GEMM (gemm_int_avx2.cpp) above avx2_max_tokens, the crossovers
// of the same measurement on an AVX2-only AMD EPYC (the same bits either way for W8A8).
constexpr int64_t kGemvMaxTokensW8A8Madd = 16, kGemvMaxTokensSparseW8A8Madd = 8,
                  kGemvMaxTokensS24W8A8Madd = 24, kGemvMaxTokensSparseW4A8Madd = 8,
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
   scalar::decode_rows_s24_i8},
  {Fmt::I8_R16, "I8_R16", 8, false, Sparsity::Dense, false, false,
   {},
   {{scalar::gemv_i8a8}, {avx2::gemv_i8a8}, {avx512::gemv_i8a8}, kGemvAlways,
    kGemvMaxTokensW8A8Madd, kGemvMaxTokensW8A8Vnni},
   scalar::decode_rows_i8_r16},
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
