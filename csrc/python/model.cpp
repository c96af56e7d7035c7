// Bindings of the native decoder: its spec (ModelConfig) and NativeModel (sparsellm._native).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
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
}

}  // namespace sl::binding
