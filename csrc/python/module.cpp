// Python bindings for the native runtime (sparsellm._native). Arrays are taken without copies:
// the Python side (sparsellm.kernels) passes C-contiguous arrays of the documented dtypes and
// these wrappers check that, so a mistake is an error, not a silent copy.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "linear.h"
#include "model.h"
#include "ops.h"
#include "threads.h"

namespace py = pybind11;
using namespace sl;

namespace {

template <typename T>
T* ptr_of(const py::array& a, const char* name) {
  if (!py::isinstance<py::array_t<T>>(a) || !(a.flags() & py::array::c_style))
    throw std::invalid_argument(std::string(name) + ": expected a C-contiguous " +
                                py::str(py::dtype::of<T>()).cast<std::string>() + " array, got " +
                                py::str(a.dtype()).cast<std::string>());
  return static_cast<T*>(const_cast<void*>(a.data()));
}

// A KV-cache array: float32, float16 (IEEE half) or int8 rows (values + scale, ops.h) ->
// (data, type); both of one cache must have the same dtype.
std::pair<void*, KvType> kv_ptr(const py::array& a, const char* name) {
  KvType type = KvType::F32;
  if (a.dtype().is(py::dtype("float16"))) type = KvType::F16;
  else if (a.dtype().is(py::dtype("int8"))) type = KvType::I8;
  else return {ptr_of<float>(a, name), type};
  if (!(a.flags() & py::array::c_style))
    throw std::invalid_argument(std::string(name) + ": expected a C-contiguous array");
  return {const_cast<void*>(a.data()), type};
}

// Caches whose last axis holds rows of head_dim values (+ the scale of int8 rows).
KVCache kv_cache_of(const py::array& k, const py::array& v, int64_t slots, int64_t capacity,
                    int64_t head_dim) {
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
  if (asym && !t.asym) throw std::invalid_argument(what + "no zero points");
  const auto need = [&](bool needed, const py::object& buffer, const char* name) {
    if (needed && buffer.is_none()) throw std::invalid_argument(what + name + " is required");
  };
  need(!t.is_float, scale, "scale");
  need(asym, zero, "zero");
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
    d["sparsity"] = t.sparsity == Sparsity::Bitmask   ? py::object(py::str("bitmask"))
                    : t.sparsity == Sparsity::TwoFour ? py::object(py::str("2:4"))
                                                      : py::object(py::none());
    d["grouped"] = t.grouped;
    d["asym"] = t.asym;
    d["fp32_activations"] = t.fp32_acts.runs();
    d["int8_activations"] = t.int8_acts.runs();
    out.append(d);
  }
  return out;
}

thread_local LinearScratch tl_scratch;
thread_local AlignedVector<float> tl_scores;

// NativeModel + the Python objects whose buffers it points into.
struct PyModel {
  std::unique_ptr<NativeModel> model;
  py::list keep;
  std::unique_ptr<std::mutex> busy = std::make_unique<std::mutex>();  // run-state is per model
  int threads = 0;       // this model's thread count per forward (ThreadScope); 0: process default
  int last_threads = 0;  // most threads that ran one region of the last forward
};

const float* vec_of(const py::dict& d, const char* key, int64_t n, py::list& keep) {
  if (!d.contains(key) || d[key].is_none()) return nullptr;
  py::array a = d[key].cast<py::array>();
  if (a.size() != n) throw std::invalid_argument(std::string(key) + ": wrong length");
  keep.append(a);
  return ptr_of<float>(a, key);
}

const Weight& weight_of(const py::dict& d, const char* key, int64_t rows, int64_t cols,
                        py::list& keep) {
  if (!d.contains(key)) throw std::invalid_argument(std::string("layer weight missing: ") + key);
  py::object o = d[key];
  const PyWeight& p = o.cast<const PyWeight&>();
  if (p.w.rows != rows || p.w.cols != cols)
    throw std::invalid_argument(std::string(key) + ": expected shape (" + std::to_string(rows) +
                                ", " + std::to_string(cols) + ")");
  keep.append(o);
  return p.w;
}

const float* arr_of(py::object o, int64_t n, const char* name, py::list& keep) {
  if (o.is_none()) return nullptr;
  py::array a = o.cast<py::array>();
  if (a.size() != n) throw std::invalid_argument(std::string(name) + ": wrong length");
  keep.append(a);
  return ptr_of<float>(a, name);
}

// config: the decoder spec (model.h ModelConfig, bound below as _native.ModelConfig); layers:
// one dict per layer of packed weights ("q", "k", "v", "o", "gate" (gated MLPs), "up", "down")
// and fp32 vectors (norms and biases, None when absent).
PyModel make_model(const ModelConfig& cfg, const py::list& layers, py::object embed,
                   py::object pos_embed, py::array final_norm, py::object final_norm_b,
                   py::object lm_head, py::object lm_head_b) {
  ModelConfig c = cfg;
  if (c.layers != int64_t(layers.size()))
    throw std::invalid_argument("config.layers must equal the number of layer dicts");
  if (c.hidden <= 0 || c.heads <= 0 || c.kv_heads <= 0 || c.head_dim <= 0 || c.vocab <= 0 ||
      c.max_tokens <= 0)
    throw std::invalid_argument("config: hidden, heads, kv_heads, head_dim, vocab and "
                                "max_tokens must be positive");
  if (int64_t(c.inv_freq.size()) * 2 != c.rotary_dim)
    throw std::invalid_argument("config: inv_freq must have rotary_dim / 2 entries");
  PyModel pm;
  const int64_t D = c.hidden, I = c.intermediate, qd = c.heads * c.head_dim,
                kvd = c.kv_heads * c.head_dim;
  std::vector<LayerWeights> lw;
  for (py::handle h : layers) {
    py::dict d = h.cast<py::dict>();
    LayerWeights l;
    l.q = weight_of(d, "q", qd, D, pm.keep);
    l.k = weight_of(d, "k", kvd, D, pm.keep);
    l.v = weight_of(d, "v", kvd, D, pm.keep);
    l.o = weight_of(d, "o", D, qd, pm.keep);
    if (c.gated) l.gate = weight_of(d, "gate", I, D, pm.keep);
    l.up = weight_of(d, "up", I, D, pm.keep);
    l.down = weight_of(d, "down", D, I, pm.keep);
    l.attn_norm = vec_of(d, "attn_norm", D, pm.keep);
    l.mlp_norm = vec_of(d, "mlp_norm", D, pm.keep);
    l.attn_norm_b = vec_of(d, "attn_norm_b", D, pm.keep);
    l.mlp_norm_b = vec_of(d, "mlp_norm_b", D, pm.keep);
    if (!l.attn_norm || (c.residual != Residual::Parallel && !l.mlp_norm))
      throw std::invalid_argument("layer norms missing");
    l.q_norm = vec_of(d, "q_norm", c.head_dim, pm.keep);
    l.k_norm = vec_of(d, "k_norm", c.head_dim, pm.keep);
    if (c.qk_norm != (l.q_norm && l.k_norm))
      throw std::invalid_argument("q_norm, k_norm (head_dim,) go with qk_norm, and only then");
    l.attn_out_norm = vec_of(d, "attn_out_norm", D, pm.keep);
    l.mlp_out_norm = vec_of(d, "mlp_out_norm", D, pm.keep);
    if (c.sandwich_norms != (l.attn_out_norm && l.mlp_out_norm))
      throw std::invalid_argument(
          "attn_out_norm, mlp_out_norm (hidden,) go with sandwich_norms, and only then");
    l.bq = vec_of(d, "bq", qd, pm.keep);
    l.bk = vec_of(d, "bk", kvd, pm.keep);
    l.bv = vec_of(d, "bv", kvd, pm.keep);
    l.bo = vec_of(d, "bo", D, pm.keep);
    l.bgate = vec_of(d, "bgate", I, pm.keep);
    l.bup = vec_of(d, "bup", I, pm.keep);
    l.bdown = vec_of(d, "bdown", D, pm.keep);
    lw.push_back(l);
  }
  const PyWeight& emb = embed.cast<const PyWeight&>();
  if (emb.w.rows != c.vocab || emb.w.cols != D)
    throw std::invalid_argument("embed must be (vocab, hidden)");
  if (final_norm.size() != D) throw std::invalid_argument("final_norm must be (hidden,)");
  const PyWeight& head = lm_head.cast<const PyWeight&>();
  if (head.w.rows != c.vocab || head.w.cols != D)
    throw std::invalid_argument("lm_head must be (vocab, hidden)");
  OuterWeights o;
  o.embed = emb.w;
  o.pos_embed = arr_of(pos_embed, c.max_positions * D, "pos_embed", pm.keep);
  o.final_norm = ptr_of<float>(final_norm, "final_norm");
  o.final_norm_b = arr_of(final_norm_b, D, "final_norm_b", pm.keep);
  o.lm_head = head.w;
  o.lm_head_b = arr_of(lm_head_b, c.vocab, "lm_head_b", pm.keep);
  pm.keep.append(embed);
  pm.keep.append(final_norm);
  pm.keep.append(lm_head);
  pm.model = std::make_unique<NativeModel>(std::move(c), std::move(lw), o);
  return pm;
}

}  // namespace

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

  m.def("weight_formats", &weight_formats,
        "The native weight formats (csrc/common.h kFmtTraits), in id order: dicts of id, name, "
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
      "GEMVs on x quantized per weight group where they have such a kernel (csrc/linear.h)");

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

  // The decoder spec's vocabulary, named as Python's ModelArgs spells it (models/decoder.py
  // RESIDUALS, sparsellm.functional.ACTIVATIONS); the ids stay on this side.
  py::enum_<Residual>(m, "Residual")
      .value("sequential", Residual::Sequential)
      .value("parallel", Residual::Parallel)
      .value("parallel_two_norms", Residual::ParallelTwoNorms);
  py::enum_<Activation>(m, "Activation")
      .value("silu", Activation::Silu)
      .value("gelu_tanh", Activation::GeluTanh)
      .value("gelu", Activation::Gelu)
      .value("relu", Activation::Relu);

  py::class_<ModelConfig>(m, "ModelConfig", "The decoder spec the native forward runs (model.h)")
      .def(py::init<>())
      .def_readwrite("hidden", &ModelConfig::hidden)
      .def_readwrite("intermediate", &ModelConfig::intermediate)
      .def_readwrite("layers", &ModelConfig::layers)
      .def_readwrite("heads", &ModelConfig::heads)
      .def_readwrite("kv_heads", &ModelConfig::kv_heads)
      .def_readwrite("head_dim", &ModelConfig::head_dim)
      .def_readwrite("vocab", &ModelConfig::vocab)
      .def_readwrite("eps", &ModelConfig::eps)
      .def_readwrite("sliding_window", &ModelConfig::sliding_window)
      .def_readwrite("max_tokens", &ModelConfig::max_tokens)
      .def_readwrite("rotary_dim", &ModelConfig::rotary_dim)
      .def_readwrite("inv_freq", &ModelConfig::inv_freq)
      .def_readwrite("layer_norm", &ModelConfig::layer_norm)
      .def_readwrite("residual", &ModelConfig::residual)
      .def_readwrite("gated", &ModelConfig::gated)
      .def_readwrite("act", &ModelConfig::act)
      .def_readwrite("max_positions", &ModelConfig::max_positions)
      .def_readwrite("qk_norm", &ModelConfig::qk_norm)
      .def_readwrite("layer_sliding", &ModelConfig::layer_sliding)
      .def_readwrite("local_inv_freq", &ModelConfig::local_inv_freq)
      .def_readwrite("attn_scale", &ModelConfig::attn_scale)
      .def_readwrite("embed_scale", &ModelConfig::embed_scale)
      .def_readwrite("sandwich_norms", &ModelConfig::sandwich_norms)
      .def_readwrite("final_logit_softcap", &ModelConfig::final_logit_softcap);

  py::class_<PyModel>(m, "NativeModel")
      .def(py::init(&make_model), py::arg("config"), py::arg("layers"), py::arg("embed"),
           py::arg("pos_embed"), py::arg("final_norm"), py::arg("final_norm_b"),
           py::arg("lm_head"), py::arg("lm_head_b"))
      .def_property_readonly(
          "config", [](const PyModel& pm) { return pm.model->config(); },
          "A copy of the spec the model was built with")
      .def_property(
          "num_threads", [](const PyModel& pm) { return pm.threads; },
          [](PyModel& pm, int n) { pm.threads = std::max(n, 0); },
          "Threads each forward runs on at most (0: the process default, set_num_threads)")
      .def_property_readonly(
          "last_threads", [](const PyModel& pm) { return pm.last_threads; },
          "Most threads that ran one parallel region of the last forward (measured)")
      .def(
          "forward",
          [](PyModel& pm, const std::vector<int64_t>& tokens, const std::vector<int64_t>& slots,
             const std::vector<int64_t>& positions, py::array k_cache, py::array v_cache,
             const std::vector<int64_t>& logit_rows, py::array out, bool prompt,
             bool dynamic_int8) {
            const ModelConfig& c = pm.model->config();
            const int64_t T = tokens.size(), R = logit_rows.size();
            if (int64_t(slots.size()) != T || int64_t(positions.size()) != T)
              throw std::invalid_argument("forward: tokens, slots, positions must all be (T,)");
            if (k_cache.ndim() != 5 || k_cache.shape(0) != c.layers ||
                k_cache.shape(2) != c.kv_heads)
              throw std::invalid_argument(
                  "forward: k_cache must be (layers, slots, kv_heads, capacity, row)");
            for (int i = 0; i < 5; ++i)
              if (v_cache.ndim() != 5 || v_cache.shape(i) != k_cache.shape(i))
                throw std::invalid_argument("forward: v_cache shape differs from k_cache");
            if (out.ndim() != 2 || out.shape(0) != R || out.shape(1) != c.vocab)
              throw std::invalid_argument("forward: out must be (len(logit_rows), vocab)");
            const KVCache kv =
                kv_cache_of(k_cache, v_cache, k_cache.shape(1), k_cache.shape(3), c.head_dim);
            float* op = ptr_of<float>(out, "out");
            py::gil_scoped_release nogil;
            std::lock_guard<std::mutex> lock(*pm.busy);  // one forward at a time per model
            ThreadScope scope(pm.threads);
            pm.model->forward(tokens.data(), slots.data(), positions.data(), T, kv,
                              logit_rows.data(), R, op, prompt, dynamic_int8);
            pm.last_threads = scope.widest();
          },
          py::arg("tokens"), py::arg("slots"), py::arg("positions"), py::arg("k_cache"),
          py::arg("v_cache"), py::arg("logit_rows"), py::arg("out"), py::arg("prompt") = false,
          py::arg("dynamic_int8") = true);

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
