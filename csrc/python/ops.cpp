// Bindings of the packed weights, linear() and the transformer ops (sparsellm._native).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "aligned.h"
#include "bindings.h"
#include "formats.h"
#include "linear.h"
#include "ops.h"

namespace sl::binding {

thread_local LinearScratch tl_scratch;

namespace {

const FmtTraits& format_named(const std::string& name) {
  std::string names;
  for (const FmtTraits& t : kFmtTraits) {
    if (name == t.name) return t;
    names += std::string(names.empty() ? "" : ", ") + t.name;
  }
  throw std::invalid_argument("unknown native weight format '" + name + "'; accepted: " + names);
}

// A weight in the format named `fmt` (a kFmtTraits name), checked against its row: the
// activations it runs with, its group and zero points, and the buffers its kernels read.
PyWeight make_weight(const std::string& fmt, int64_t rows, int64_t cols, int64_t kp,
                     bool act_int8, int group, bool asym, py::array data, py::object scale,
                     py::object zero, py::object mask, py::object row_off, py::object meta) {
  const FmtTraits& t = format_named(fmt);
  const std::string what = std::string(t.name) + " weights: ";
  if (!t.gemvs(act_int8).runs())
    throw std::invalid_argument(what + "no kernel for " + (act_int8 ? "int8" : "fp32") +
                                " activations");
  if (kp % kColAlign || kp < cols) throw std::invalid_argument("kp must be a multiple of 64 >= cols");
  if (t.grouped ? group <= 0 || group % 32 || kp % group : group != 0)
    throw std::invalid_argument(what + (t.grouped ? "group must be 32k and divide kp"
                                                  : "no group scales (group must be 0)"));
  if (t.superblock && (group != 32 || kp % t.superblock))
    throw std::invalid_argument(what + "group must be 32 and kp a multiple of " +
                                std::to_string(t.superblock));
  if (asym && !t.asym) throw std::invalid_argument(what + "no zero points");
  const auto need = [&](bool needed, const py::object& buffer, const char* name) {
    if (needed && buffer.is_none()) throw std::invalid_argument(what + name + " is required");
  };
  need(!t.is_float, scale, "scale");
  need(asym || t.superblock, zero, "zero");
  need(t.sparsity == Sparsity::Bitmask, mask, "mask");
  need(t.sparsity == Sparsity::Bitmask, row_off, "row_off");
  need(t.sparsity == Sparsity::TwoFour, meta, "meta");
  PyWeight p;
  Weight& w = p.w;
  w.fmt = t.fmt;
  w.rows = rows;
  w.cols = cols;
  w.kp = kp;
  w.act_int8 = act_int8;
  w.group = group;
  w.asym = asym;
  if (!(data.flags() & py::array::c_style)) throw std::invalid_argument("data must be C-contiguous");
  check_aligned(data, size_t(data.itemsize()), "data");
  w.data = data.data();
  w.scale = opt_ptr<float>(scale, "scale");
  w.zero = opt_ptr<uint8_t>(zero, "zero");
  w.mask = opt_ptr<uint8_t>(mask, "mask");
  w.row_off = opt_ptr<int64_t>(row_off, "row_off");
  w.meta = opt_ptr<uint64_t>(meta, "meta");
  p.keep = py::make_tuple(data, scale, zero, mask, row_off, meta);
  return p;
}

// kFmtTraits for Python: one dict per format, in id order.
py::list weight_formats() {
  py::list out;
  for (const FmtTraits& t : kFmtTraits) {
    py::dict d;
    d["id"] = int(t.fmt);
    d["name"] = t.name;
    d["value_bits"] = t.value_bits;
    d["float"] = t.is_float;
    const char* sparsity = sparsity_name(t.sparsity);
    d["sparsity"] = sparsity ? py::object(py::str(sparsity)) : py::object(py::none());
    d["grouped"] = t.grouped;
    d["asym"] = t.asym;
    d["superblock"] = t.superblock;
    d["fp32_activations"] = t.fp32_acts.runs();
    d["int8_activations"] = t.int8_acts.runs();
    out.append(d);
  }
  return out;
}

thread_local AlignedVector<float> tl_scores;

}  // namespace

void bind_linear(py::module_& m) {
  m.def("weight_formats", &weight_formats,
        "The native weight formats (csrc/include/formats.h kFmtTraits), in id order: dicts of id, name, "
        "value_bits, float, sparsity (None, 'bitmask' or '2:4'), grouped, asym, and the "
        "activations they run with (fp32_activations, int8_activations)");

  py::class_<PyWeight>(m, "NativeWeight")
      .def(py::init(&make_weight), py::arg("fmt"), py::arg("rows"), py::arg("cols"),
           py::arg("kp"), py::arg("act_int8"), py::arg("group"), py::arg("asym"), py::arg("data"),
           py::arg("scale") = py::none(), py::arg("zero") = py::none(),
           py::arg("mask") = py::none(), py::arg("row_off") = py::none(),
           py::arg("meta") = py::none())
      .def_property_readonly("rows", [](const PyWeight& p) { return p.w.rows; })
      .def_property_readonly("cols", [](const PyWeight& p) { return p.w.cols; })
      .def_property_readonly("gemv_max_tokens",
                             [](const PyWeight& p) { return gemv_max_tokens(p.w); })
      .def_property_readonly(
          "int8_gemm_act_group",
          [](const PyWeight& p) -> int64_t {
            return int_gemm_act_group(p.w);
          },
          "Above gemv_max_tokens, on the active ISA: -1 for the fp32 GEMM, else the integer "
          "GEMM (AVX2 int16 / int8, AVX-512 int8) with activations quantized per this many "
          "columns (0: per token, W8A8 / W4A8; > 0, weight-only int4, and int8 on AVX-512: for "
          "a prompt only)")
      .def_property_readonly(
          "group_int8_act_group",
          [](const PyWeight& p) -> int64_t { return group_int8_act_group(p.w); },
          "With dynamic_int8, on the active ISA: > 0 if this weight-only weight's GEMV quantizes "
          "x per this many columns (its group_int8 kernel), else -1; above gemv_max_tokens, "
          "where it equals int8_gemm_act_group, the integer GEMM does too");

  m.def(
      "linear",
      [](py::array x, const PyWeight& p, py::array out, bool prompt, bool dynamic_int8) {
        const Weight& w = p.w;
        if (x.ndim() != 2 || x.shape(1) != w.cols)
          throw std::invalid_argument("linear: x must be (T, " + std::to_string(w.cols) + ")");
        if (out.ndim() != 2 || out.shape(0) != x.shape(0) || out.shape(1) != w.rows)
          throw std::invalid_argument("linear: out must be (T, " + std::to_string(w.rows) + ")");
        const float* xp = ptr_of<float>(x, "x");
        float* yp = ptr_of<float>(out, "out");
        const int64_t T = x.shape(0);
        py::gil_scoped_release nogil;
        tl_scratch.prompt = prompt;
        tl_scratch.group_int8 = dynamic_int8;
        linear(w, xp, T, w.cols, yp, w.rows, tl_scratch);
      },
      py::arg("x"), py::arg("weight"), py::arg("out"), py::arg("prompt") = false,
      py::arg("dynamic_int8") = false,
      "out = x @ W.T (x: (T, in) fp32); prompt: as a prompt chunk; dynamic_int8: weight-only "
      "GEMVs on x quantized per weight group where they have such a kernel (csrc/include/linear.h)");
}

void bind_ops(py::module_& m) {
  m.def(
      "rms_norm",
      [](py::array x, py::array w, float eps, py::array out) {
        const int64_t D = x.shape(x.ndim() - 1), T = x.size() / D;
        if (w.size() != D || out.size() != x.size()) throw std::invalid_argument("rms_norm: shapes");
        const float *xp = ptr_of<float>(x, "x"), *wp = ptr_of<float>(w, "weight");
        float* op = ptr_of<float>(out, "out");
        py::gil_scoped_release nogil;
        rms_norm(xp, wp, op, T, D, eps);
      },
      py::arg("x"), py::arg("weight"), py::arg("eps"), py::arg("out"));

  m.def(
      "rope_",
      [](py::array x, py::array positions, py::array inv_freq) {
        if (x.ndim() != 3) throw std::invalid_argument("rope_: x must be (T, heads, head_dim)");
        // inv_freq (rot/2,) sets how many leading dims of each head rotate (partial RoPE).
        const int64_t T = x.shape(0), H = x.shape(1), hd = x.shape(2), half = inv_freq.size();
        if (positions.size() != T || 2 * half > hd)
          throw std::invalid_argument("rope_: positions (T,) and inv_freq (<= head_dim/2,) expected");
        float* xp = ptr_of<float>(x, "x");
        const int64_t* pp = ptr_of<int64_t>(positions, "positions");
        const double* fp = ptr_of<double>(inv_freq, "inv_freq");
        py::gil_scoped_release nogil;
        std::vector<float> cs(size_t(T * half)), sn(size_t(T * half));
        rope_tables(pp, T, fp, half, cs.data(), sn.data());
        apply_rope(xp, T, H, hd, 2 * half, H * hd, cs.data(), sn.data());
      },
      py::arg("x"), py::arg("positions"), py::arg("inv_freq"),
      "Half-split RoPE in place on the first 2 * len(inv_freq) dims of each head");

  m.def(
      "layer_norm",
      [](py::array x, py::array w, py::object b, float eps, py::array out) {
        const int64_t D = x.shape(x.ndim() - 1), T = x.size() / D;
        if (w.size() != D || out.size() != x.size()) throw std::invalid_argument("layer_norm: shapes");
        py::list keep;
        const float* bp = arr_of(b, D, "bias", keep);
        const float *xp = ptr_of<float>(x, "x"), *wp = ptr_of<float>(w, "weight");
        float* op = ptr_of<float>(out, "out");
        py::gil_scoped_release nogil;
        layer_norm(xp, wp, bp, op, T, D, eps);
      },
      py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("eps"), py::arg("out"));

  m.def(
      "activation_",
      [](py::array x, Activation act) {
        float* xp = ptr_of<float>(x, "x");
        const int64_t n = x.size();
        py::gil_scoped_release nogil;
        activation(xp, n, act);
      },
      py::arg("x"), py::arg("act"), "In place: an Activation (silu, gelu_tanh, gelu (erf), relu)");

  m.def(
      "swiglu",
      [](py::array g, py::array u, py::array out) {
        if (g.size() != u.size() || out.size() != g.size()) throw std::invalid_argument("swiglu: sizes");
        const float *gp = ptr_of<float>(g, "g"), *up = ptr_of<float>(u, "u");
        float* op = ptr_of<float>(out, "out");
        py::gil_scoped_release nogil;
        swiglu(gp, up, op, g.size());
      },
      py::arg("g"), py::arg("u"), py::arg("out"));

  m.def(
      "add_",
      [](py::array x, py::array y) {
        if (x.size() != y.size()) throw std::invalid_argument("add_: sizes differ");
        float* xp = ptr_of<float>(x, "x");
        const float* yp = ptr_of<float>(y, "y");
        py::gil_scoped_release nogil;
        add_inplace(xp, yp, x.size());
      },
      py::arg("x"), py::arg("y"), "x += y in place");

  m.def(
      "softmax_",
      [](py::array x) {
        const int64_t n = x.shape(x.ndim() - 1), rows = x.size() / n;
        float* xp = ptr_of<float>(x, "x");
        py::gil_scoped_release nogil;
        for (int64_t r = 0; r < rows; ++r) softmax_inplace(xp + r * n, n);
      },
      py::arg("x"), "Softmax over the last axis, in place");

  m.def(
      "attention",
      [](py::array q, py::array k_cache, py::array v_cache, py::array slots, py::array positions,
         float scale, int64_t window, py::array out, bool prompt) {
        if (q.ndim() != 3 || k_cache.ndim() != 4 || v_cache.ndim() != 4)
          throw std::invalid_argument("attention: q (T,H,hd), caches (slots,KV,cap,row) expected");
        AttnShape s{q.shape(0), q.shape(1), k_cache.shape(1), q.shape(2), k_cache.shape(2), scale,
                    window};
        if (s.H % s.KV || slots.size() != s.T || positions.size() != s.T ||
            out.size() != q.size())
          throw std::invalid_argument("attention: inconsistent shapes");
        const float* qp = ptr_of<float>(q, "q");
        const KVCache kv = kv_cache_of(k_cache, v_cache, k_cache.shape(0), s.cap, s.hd);
        s.kv = kv.type;
        s.prompt = prompt;
        const int64_t* sp = ptr_of<int64_t>(slots, "slots");
        const int64_t* pp = ptr_of<int64_t>(positions, "positions");
        for (int64_t t = 0; t < s.T; ++t)
          if (pp[t] < 0 || pp[t] >= s.cap || sp[t] < 0 || sp[t] >= k_cache.shape(0))
            throw std::out_of_range("attention: position or slot out of the cache");
        float* op = ptr_of<float>(out, "out");
        py::gil_scoped_release nogil;
        attention(qp, s.H * s.hd, kv.k, kv.v, sp, pp, s, op, s.H * s.hd, tl_scores);
      },
      py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("slots"),
      py::arg("positions"), py::arg("scale"), py::arg("window"), py::arg("out"),
      py::arg("prompt") = false);

  m.def(
      "to_half",
      [](py::array x, py::array out) {
        if (x.size() != out.size() || !out.dtype().is(py::dtype("float16")) ||
            !(out.flags() & py::array::c_style))
          throw std::invalid_argument(
              "to_half: out must be a C-contiguous float16 array of x's size");
        const float* xp = ptr_of<float>(x, "x");
        uint16_t* op = static_cast<uint16_t*>(out.mutable_data());
        py::gil_scoped_release nogil;
        to_half(xp, op, x.size());
      },
      py::arg("x"), py::arg("out"),
      "Round fp32 to IEEE half (nearest even), as the fp16 KV cache does");

  m.def(
      "to_kv_int8",
      [](py::array x, py::array out) {
        if (x.ndim() != 2 || out.ndim() != 2 || out.shape(0) != x.shape(0) ||
            out.shape(1) != kv_row<int8_t>(x.shape(1)) || !out.dtype().is(py::dtype("int8")) ||
            !(out.flags() & py::array::c_style))
          throw std::invalid_argument("to_kv_int8: x (n, hd) float32, out (n, hd + 4) int8");
        const float* xp = ptr_of<float>(x, "x");
        int8_t* op = static_cast<int8_t*>(out.mutable_data());
        const int64_t n = x.shape(0), hd = x.shape(1);
        py::gil_scoped_release nogil;
        for (int64_t i = 0; i < n; ++i) to_kv_int8(xp + i * hd, hd, op + i * (hd + kKvScaleBytes));
      },
      py::arg("x"), py::arg("out"), "Rows of the int8 KV cache (values, then float scale)");
}

}  // namespace sl::binding
