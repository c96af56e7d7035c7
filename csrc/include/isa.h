// ISA selection (runtime/cpu.cpp; threads: threads.h): which kernels run on this CPU.
#pragma once

#include <string>

namespace sl {

// Avx512 adds the kernels of kernels/avx512/ to the AVX2 set: the W8A8 (dense, bitmask, 2:4),
// dense int4 (W4A16, W4A8) and sparse int4 GEMVs, weight-only int8 (dense, bitmask, 2:4) and
// bitmask fp32 GEMVs (gemv_int8.cpp, gemv_int4.cpp, gemv_sparse.cpp), the GEMMs (gemm.cpp,
// gemm_int.cpp, gemm_sparse.cpp), the row decoders (decode.cpp) and prompt attention
// (attention.cpp); every other kernel stays AVX2 there. It implies AVX2.
enum class Isa { Scalar = 0, Avx2 = 1, Avx512 = 2 };

bool cpu_supports_avx2();     // AVX2 + FMA + F16C + POPCNT, checked once with cpuid
bool cpu_supports_avx512();   // AVX2 set + AVX512 F/BW/VL/VNNI/VBMI/VBMI2
Isa active_isa();             // what kernels dispatch to now (default: best supported)
bool prefetch_single_stream();  // software prefetch for one token's weight stream (tiles.h)
void set_isa(const std::string& name);  // "scalar" | "avx2" | "avx512" | "auto"; throws if unsupported
inline bool use_avx2() { return active_isa() >= Isa::Avx2; }
inline bool use_avx512() { return active_isa() == Isa::Avx512; }

}  // namespace sl
