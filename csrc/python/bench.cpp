// Bindings of the measurements: linear() timed on weights streamed from DRAM, and the read
// bandwidth they are compared with (sparsellm._native).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <vector>

#include "bindings.h"
#include "linear.h"
#include "threads.h"

namespace sl::binding {

void bind_bench(py::module_& m) {
  m.def(
      "bench_linear",
      [](std::vector<const PyWeight*> ws, py::array x, int64_t iters, bool prompt,
         bool dynamic_int8) {
        // Seconds per linear() call, cycling through `ws` (copies of one matrix whose total
        // size exceeds the last-level cache, so every call streams its weights from DRAM);
        // x's tokens are a prompt's or not (linear's `prompt`, and `dynamic_int8`).
        if (ws.empty()) throw std::invalid_argument("bench_linear: no weights");
        const Weight& w0 = ws[0]->w;
        if (x.ndim() != 2 || x.shape(1) != w0.cols) throw std::invalid_argument("bench_linear: x");
        const float* xp = ptr_of<float>(x, "x");
        const int64_t T = x.shape(0);
        std::vector<float> y(size_t(T * w0.rows));
        py::gil_scoped_release nogil;
        tl_scratch.prompt = prompt;
        tl_scratch.group_int8 = dynamic_int8;
        for (const PyWeight* p : ws) linear(p->w, xp, T, w0.cols, y.data(), w0.rows, tl_scratch);
        const auto t0 = std::chrono::steady_clock::now();
        for (int64_t i = 0; i < iters; ++i)
          linear(ws[i % ws.size()]->w, xp, T, w0.cols, y.data(), w0.rows, tl_scratch);
        const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
        tl_scratch.prompt = tl_scratch.group_int8 = false;
        return dt.count() / double(iters);
      },
      py::arg("weights"), py::arg("x"), py::arg("iters"), py::arg("prompt") = false,
      py::arg("dynamic_int8") = false);

  m.def(
      "read_bandwidth",
      [](int64_t nbytes, int64_t reps) {
        // The ceiling GEMVs are compared with, measured in the same run (these machines are
        // noisy): a parallel sum over a buffer larger than the last-level cache, best of reps.
        std::vector<uint64_t> buf(size_t(nbytes / 8), 1);
        const uint64_t* b = buf.data();
        const int64_t n = int64_t(buf.size());
        py::gil_scoped_release nogil;
        double best = 1e30;
        uint64_t sink = 0;
        for (int64_t r = 0; r < reps; ++r) {
          const auto t0 = std::chrono::steady_clock::now();
          std::atomic<uint64_t> total{0};
          parallel_for(n, true, [&](int64_t i0, int64_t i1) {
            uint64_t part = 0;
            for (int64_t i = i0; i < i1; ++i) part += b[i];
            total += part;
          });
          const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
          best = std::min(best, dt.count());
          sink += total;
        }
        return sink ? double(nbytes) / best / 1e9 : 0.0;
      },
      py::arg("nbytes"), py::arg("reps") = 5, "GB/s of a plain streaming read of nbytes");
}

}  // namespace sl::binding
