// Python bindings for the native runtime (sparsellm._native). Arrays are taken without copies:
// the Python side (sparsellm.kernels) passes C-contiguous arrays of the documented dtypes and
// these wrappers check that, so a mistake is an error, not a silent copy.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <utility>

#include "bindings.h"
#include "isa.h"
#include "linear.h"
#include "threads.h"

namespace py = pybind11;
using namespace sl;

PYBIND11_MODULE(_native, m) {
  m.doc() = "sparsellm native CPU kernels (AVX2+FMA and AVX-512 paths with a portable scalar fallback, own thread pool)";

  m.def("cpu_supports_avx2", &cpu_supports_avx2, "True if AVX2+FMA+F16C are available");
  m.def("cpu_supports_avx512", &cpu_supports_avx512,
        "True if AVX512 F/BW/VL/VNNI/VBMI2 are available (the int8 W8A8 kernels' fast path)");
  m.def("get_isa", [] {
    const Isa isa = active_isa();
    return isa == Isa::Avx512 ? "avx512" : isa == Isa::Avx2 ? "avx2" : "scalar";
  });
  m.def("set_isa", &set_isa, py::arg("name"),
        "Kernel ISA: 'scalar', 'avx2', 'avx512' or 'auto'");
  m.def("get_num_threads", &num_threads);
  m.def("set_num_threads", &set_num_threads, py::arg("n"),
        "process-default worker threads (<= 0: all cores)");
  m.def(
      "region_threads",
      [](int n) {
        py::gil_scoped_release nogil;
        ThreadScope scope(n);
        std::atomic<int> ids{0};
        parallel(true, [&](int, int) { ids.fetch_add(1); });
        return std::make_pair(scope.widest(), ids.load());
      },
      py::arg("n"),
      "Runs one empty parallel region at a per-call count of n threads (<= 0: the process "
      "default) -> (threads the pool reports, threads that ran the task); for tests");
  m.def("set_gemv_max_tokens", &set_gemv_max_tokens, py::arg("n"),
        "Largest T served by the multi-token GEMV (above: decoded-panel GEMM) for every format; "
        "0: the per-format defaults. For measurements");

  binding::bind_linear(m);
  binding::bind_bench(m);
  binding::bind_model(m);
  binding::bind_ops(m);
}
