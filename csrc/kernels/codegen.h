// Code-generation helpers of the kernels (kernels/): loop unrolling and the check that a
// kernel template inlines its per-vector callables.
#pragma once

#include <type_traits>

// Fully unrolls the loop that follows. GCC 12 keeps an array of SIMD accumulators in registers
// only if the loops that zero and read it are unrolled before its scalar replacement pass; with
// those left rolled, attention's weighted sums stored all 12 accumulators to the stack on every
// key (and reloaded them), a third of their time.
#define SL_UNROLL _Pragma("GCC unroll 16")

namespace sl {

// Whether F, a kernel template's per-vector callable, is a closure object the kernel inlines. A
// function passed as one decays to a pointer, called per step, which no test of the values
// notices but makes a kernel several times slower. Kernels static_assert it.
template <class... F>
inline constexpr bool inlined_callables = (!std::is_pointer_v<F> && ...);

}  // namespace sl
