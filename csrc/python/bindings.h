// What the Python bindings (python/*.cpp) share: array checks, KV-cache arrays, the packed
// weight handed to native code, and the bind_* functions module.cpp calls, in the order the
// module registers them (a type is registered before a signature names it).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "linear.h"
#include "model.h"
#include "ops.h"
#include "weight.h"

namespace sl::binding {

namespace py = pybind11;

// Kernels load whole elements, and a misaligned one is undefined behaviour: a buffer viewed in
// place from a file's bytes can sit at any address (kernels/formats.py PackedWeight.native
// copies such a buffer first), so one that reaches here misaligned is refused, never read.
inline void check_aligned(const py::array& a, size_t alignment, const char* name) {
  const auto address = reinterpret_cast<uintptr_t>(a.data());
  if (address % alignment)
    throw std::invalid_argument(std::string(name) + ": its buffer is not aligned to " +
                                std::to_string(alignment) + " bytes (address " +
                                std::to_string(address) + "); copy it first");
}

template <typename T>
T* ptr_of(const py::array& a, const char* name) {
  if (!py::isinstance<py::array_t<T>>(a) || !(a.flags() & py::array::c_style))
    throw std::invalid_argument(std::string(name) + ": expected a C-contiguous " +
                                py::str(py::dtype::of<T>()).cast<std::string>() + " array, got " +
                                py::str(a.dtype()).cast<std::string>());
  check_aligned(a, alignof(T), name);
  return static_cast<T*>(const_cast<void*>(a.data()));
}

// A KV-cache array: float32, float16 (IEEE half) or int8 rows (values + scale, ops.h) ->
// (data, type); both of one cache must have the same dtype.
inline std::pair<void*, KvType> kv_ptr(const py::array& a, const char* name) {
  KvType type = KvType::F32;
  if (a.dtype().is(py::dtype("float16"))) type = KvType::F16;
  else if (a.dtype().is(py::dtype("int8"))) type = KvType::I8;
  else return {ptr_of<float>(a, name), type};
  if (!(a.flags() & py::array::c_style))
    throw std::invalid_argument(std::string(name) + ": expected a C-contiguous array");
  check_aligned(a, size_t(a.itemsize()), name);
  return {const_cast<void*>(a.data()), type};
}

// Caches whose last axis holds rows of head_dim values (+ the scale of int8 rows).
inline KVCache kv_cache_of(const py::array& k, const py::array& v, int64_t slots,
                           int64_t capacity, int64_t head_dim) {
  const auto [kp, kt] = kv_ptr(k, "k_cache");
  const auto [vp, vt] = kv_ptr(v, "v_cache");
  if (kt != vt) throw std::invalid_argument("k_cache and v_cache must have the same dtype");
  const int64_t row = kv_row_bytes(kt, head_dim) / k.itemsize();
  if (k.shape(k.ndim() - 1) != row)
    throw std::invalid_argument("KV cache rows must hold " + std::to_string(row) +
                                " elements (head_dim" +
                                (kt == KvType::I8 ? std::string(" + 4 bytes of scale)") : ")"));
  return KVCache{kp, vp, slots, capacity, kt};
}

template <typename T>
T* opt_ptr(const py::object& o, const char* name) {
  return o.is_none() ? nullptr : ptr_of<T>(o.cast<py::array>(), name);
}

// A packed weight handed to native code: the descriptor + references keeping buffers alive.
struct PyWeight {
  Weight w;
  py::tuple keep;
};

inline const float* arr_of(py::object o, int64_t n, const char* name, py::list& keep) {
  if (o.is_none()) return nullptr;
  py::array a = o.cast<py::array>();
  if (a.size() != n) throw std::invalid_argument(std::string(name) + ": wrong length");
  keep.append(a);
  return ptr_of<float>(a, name);
}

// linear()'s work buffers of the calling thread (python/ops.cpp).
extern thread_local LinearScratch tl_scratch;

void bind_linear(py::module_& m);  // weight formats, NativeWeight, linear (python/ops.cpp)
void bind_bench(py::module_& m);   // bench_linear, read_bandwidth (python/bench.cpp)
void bind_model(py::module_& m);   // Residual, Activation, ModelConfig, NativeModel (model.cpp)
void bind_ops(py::module_& m);     // the transformer ops (python/ops.cpp)

}  // namespace sl::binding
