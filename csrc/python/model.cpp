// Bindings of the native decoder: its spec (ModelConfig) and NativeModel (sparsellm._native).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "bindings.h"
#include "model.h"
#include "threads.h"

namespace sl::binding {

namespace {

// NativeModel + the Python objects whose buffers it points into.
struct PyModel {
  std::unique_ptr<NativeModel> model;
  py::list keep;
  std::unique_ptr<std::mutex> busy = std::make_unique<std::mutex>();  // run-state is per model
  int threads = 0;       // this model's thread count per forward (ThreadScope); 0: process default
  int last_threads = 0;  // most threads that ran one region of the last forward
};

// A layer's tensors as Python hands them over: one attribute per field of LayerWeights
// (model.h SL_LAYER_MATRICES / SL_LAYER_VECTORS), None when absent. Bound as
// _native.LayerWeights; an unknown attribute is an AttributeError, not a key ignored.
struct PyLayer {
#define SL_PY_FIELD(name, ...) py::object name = py::none();
  SL_LAYER_MATRICES(SL_PY_FIELD)
  SL_LAYER_VECTORS(SL_PY_FIELD)
#undef SL_PY_FIELD
};

const float* vec_of(const py::object& o, const char* key, int64_t n, py::list& keep) {
  if (o.is_none()) return nullptr;
  py::array a = o.cast<py::array>();
  if (a.size() != n) throw std::invalid_argument(std::string(key) + ": wrong length");
  keep.append(a);
  return ptr_of<float>(a, key);
}

const Weight& weight_of(const py::object& o, const char* key, int64_t rows, int64_t cols,
                        py::list& keep) {
  if (o.is_none()) throw std::invalid_argument(std::string("layer weight missing: ") + key);
  const PyWeight& p = o.cast<const PyWeight&>();
  if (p.w.rows != rows || p.w.cols != cols)
    throw std::invalid_argument(std::string(key) + ": expected shape (" + std::to_string(rows) +
                                ", " + std::to_string(cols) + ")");
  keep.append(o);
  return p.w;
}

// config: the decoder spec (model.h ModelConfig, bound below as _native.ModelConfig); layers:
// one _native.LayerWeights per layer (packed matrices and fp32 vectors, model.h LayerWeights).
PyModel make_model(const ModelConfig& cfg, const std::vector<const PyLayer*>& layers,
                   py::object embed,
                   py::object pos_embed, py::array final_norm, py::object final_norm_b,
                   py::object lm_head, py::object lm_head_b) {
  ModelConfig c = cfg;
  if (c.layers != int64_t(layers.size()))
    throw std::invalid_argument("config.layers must equal the number of layers given");
  if (c.hidden <= 0 || c.heads <= 0 || c.kv_heads <= 0 || c.head_dim <= 0 || c.vocab <= 0 ||
      c.max_tokens <= 0)
    throw std::invalid_argument("config: hidden, heads, kv_heads, head_dim, vocab and "
                                "max_tokens must be positive");
  if (int64_t(c.inv_freq.size()) * 2 != c.rotary_dim)
    throw std::invalid_argument("config: inv_freq must have rotary_dim / 2 entries");
  PyModel pm;
  // the sizes SL_LAYER_MATRICES / SL_LAYER_VECTORS are written in
  const int64_t D = c.hidden, I = c.intermediate, QD = c.heads * c.head_dim,
                KVD = c.kv_heads * c.head_dim, HD = c.head_dim;
  std::vector<LayerWeights> lw;
  for (const PyLayer* p : layers) {
    if (p == nullptr) throw std::invalid_argument("layers: None is not a LayerWeights");
    LayerWeights l;
// every matrix is required but gate, which goes with a gated MLP (checked below)
#define SL_TAKE_MATRIX(name, rows, cols)                        \
  if (!p->name.is_none() || std::string_view(#name) != "gate") \
    l.name = weight_of(p->name, #name, rows, cols, pm.keep);
#define SL_TAKE_VECTOR(name, length) l.name = vec_of(p->name, #name, length, pm.keep);
    SL_LAYER_MATRICES(SL_TAKE_MATRIX)
    SL_LAYER_VECTORS(SL_TAKE_VECTOR)
#undef SL_TAKE_MATRIX
#undef SL_TAKE_VECTOR
    if (c.gated == p->gate.is_none())
      throw std::invalid_argument("gate (intermediate, hidden) goes with gated, and only then");
    if (!l.attn_norm || (c.residual != Residual::Parallel && !l.mlp_norm))
      throw std::invalid_argument("layer norms missing");
    if (c.qk_norm != (l.q_norm && l.k_norm))
      throw std::invalid_argument("q_norm, k_norm (head_dim,) go with qk_norm, and only then");
    if (c.sandwich_norms != (l.attn_out_norm && l.mlp_out_norm))
      throw std::invalid_argument(
          "attn_out_norm, mlp_out_norm (hidden,) go with sandwich_norms, and only then");
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

void bind_model(py::module_& m) {
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

  py::class_<ModelConfig> config(m, "ModelConfig",
                                 "The decoder spec the native forward runs (model.h)");
  config.def(py::init<>());
#define SL_BIND_CONFIG(type, name, init, help) \
  config.def_readwrite(#name, &ModelConfig::name, help);
  SL_MODEL_CONFIG_FIELDS(SL_BIND_CONFIG)
#undef SL_BIND_CONFIG

  py::class_<PyLayer> layer(m, "LayerWeights",
                            "One layer's packed matrices and fp32 vectors (model.h LayerWeights; "
                            "None when absent)");
  layer.def(py::init<>());
  py::list matrices, vectors;
#define SL_BIND_LAYER(name, ...) layer.def_readwrite(#name, &PyLayer::name);
#define SL_NAME_MATRIX(name, rows, cols) matrices.append(#name);
#define SL_NAME_VECTOR(name, length) vectors.append(#name);
  SL_LAYER_MATRICES(SL_BIND_LAYER)
  SL_LAYER_VECTORS(SL_BIND_LAYER)
  SL_LAYER_MATRICES(SL_NAME_MATRIX)
  SL_LAYER_VECTORS(SL_NAME_VECTOR)
#undef SL_BIND_LAYER
#undef SL_NAME_MATRIX
#undef SL_NAME_VECTOR
  layer.attr("matrices") = py::tuple(matrices);  // the field names, in declaration order
  layer.attr("vectors") = py::tuple(vectors);

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
}

}  // namespace sl::binding
