// Packed weight descriptor: a non-owning view of the NumPy buffers built by
// sparsellm.kernels.formats (the Python object keeps them alive). y = x @ W.T, W is (rows, cols).
// The layouts of the packed formats and the helpers kernels walk them with.
#pragma once

#include <cstdint>
#include <type_traits>

namespace sl {

// All packed rows are padded to a multiple of this many columns (zeros in the weights, zeros
// in the activations) so kernels never need a tail loop. SmolLM2 / Llama widths are multiples.
constexpr int64_t kColAlign = 64;

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
  I4K,     // int4 in Q4_K's form: nibbles as I4, 6-bit group scales and mins, see kSuperblock
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
  const uint8_t* zero = nullptr;     // I4 asym: (rows, kp/G) zero points 0..15; I4K: codes
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
// 16-column chunk kSlotChunk[s] (see kernels/scalar/gemv_sparse.cpp; the AVX2 kernel gathers x by
// it).
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

// I4K, int4 in the form of llama.cpp's Q4_K (a GGUF Q4_K tensor runs at its own width): the
// nibbles of I4 in groups of 32 columns, 8 groups to a superblock of 256 columns whose float
// pair {d, dmin} is w.scale (rows, kp/256, 2) and whose 16 bytes of w.zero (rows, kp/256, 16)
// are the groups' 6-bit scale codes sc, then their min codes m: w = d * sc * q - dmin * m, every
// product exact in fp32. Per group, dot(w, x) = s * dot(q, x) - m' * sum(x) with s = d * sc and
// m' = dmin * m: I4's algebra with the zero-point term's s * z replaced by m'.
constexpr int64_t kSuperblock = 256;
inline const float* i4k_super(const Weight& w, int64_t r, int64_t g) {  // {d, dmin} of group g
  return w.scale + 2 * (r * (w.kp / kSuperblock) + g / 8);
}
inline const uint8_t* i4k_codes(const Weight& w, int64_t r, int64_t g) {  // sc[g % 8], m at + 8
  return w.zero + 16 * (r * (w.kp / kSuperblock) + g / 8) + g % 8;
}
inline float i4k_scale(const Weight& w, int64_t r, int64_t g) {
  return i4k_super(w, r, g)[0] * float(i4k_codes(w, r, g)[0]);
}
inline float i4k_min(const Weight& w, int64_t r, int64_t g) {
  return i4k_super(w, r, g)[1] * float(i4k_codes(w, r, g)[8]);
}

// Int4 layout: a row is kp/32 blocks of 16 bytes; byte j of a block holds value j in its low
// nibble and value j+16 in its high nibble (llama.cpp Q4_0 order), so one AVX2 and/shift turns
// a block into 32 bytes in column order. Stored q is unsigned 0..15; w = (q - z) * s with z = 8
// for symmetric groups.

}  // namespace sl
