// NativeModel: the whole decoder forward (embedding -> layers -> final norm -> lm_head) in one
// native call, over a flat batch of T tokens from any number of sequences (twin of
// sparsellm.models.decoder.DecoderModel.forward, with the same spec flags). Weights are
// non-owning views (the Python wrapper keeps the packed buffers alive); run-state buffers are
// allocated once for max_tokens, so a forward call allocates nothing.
#pragma once

#include <vector>

#include "aligned.h"
#include "linear.h"
#include "ops.h"
#include "weight.h"

namespace sl {

enum class Residual : int {
  Sequential = 0,        // x += attn(n1(x)); x += mlp(n2(x))
  Parallel = 1,          // x += attn(n1(x)) + mlp(n1(x))   (one shared norm)
  ParallelTwoNorms = 2,  // x += attn(n1(x)) + mlp(n2(x))
};

// The decoder spec, declared once: X(type, name, default, help) makes the struct below and its
// Python binding (_native.ModelConfig, python/model.cpp), so a new field is one line here.
#define SL_MODEL_CONFIG_FIELDS(X)                                                               \
  X(int64_t, hidden, 0, "hidden size")                                                          \
  X(int64_t, intermediate, 0, "MLP width")                                                      \
  X(int64_t, layers, 0, "decoder layers")                                                       \
  X(int64_t, heads, 0, "query heads")                                                           \
  X(int64_t, kv_heads, 0, "key/value heads")                                                    \
  X(int64_t, head_dim, 0, "dimensions per head")                                                \
  X(int64_t, vocab, 0, "vocabulary size")                                                       \
  X(float, eps, 1e-6f, "the norms' epsilon")                                                    \
  X(int64_t, sliding_window, 0, "keys a query attends to (0: full causal attention)")           \
  X(std::vector<bool>, layer_sliding, {},                                                       \
    "per layer (empty: every layer alike): whether it attends within sliding_window")           \
  X(std::vector<double>, local_inv_freq, {}, "empty, or the RoPE of sliding layers (own base)") \
  X(float, attn_scale, 0.0f, "score scale (0: 1/sqrt(head_dim))")                               \
  X(float, embed_scale, 1.0f, "token embeddings are multiplied by it (Gemma: sqrt(hidden))")    \
  X(bool, sandwich_norms, false, "norms on the attention and MLP outputs (Gemma 2/3)")          \
  X(float, final_logit_softcap, 0.0f, "logits = cap * tanh(logits / cap) (0: none)")            \
  X(int64_t, max_tokens, 0, "largest T of one forward call (buffers are sized for it)")         \
  X(int64_t, rotary_dim, 0, "half-split RoPE on the first rotary_dim dims of each head")        \
  X(std::vector<double>, inv_freq, {}, "(rotary_dim / 2,) RoPE inverse frequencies")            \
  X(bool, layer_norm, false, "LayerNorm (+ optional bias) instead of RMSNorm")                  \
  X(Residual, residual, Residual::Sequential, "how attention and MLP join the residual")        \
  X(bool, gated, true, "down(act(gate(h)) * up(h)) vs down(act(up(h)))")                        \
  X(Activation, act, Activation::Silu, "the MLP's activation")                                  \
  X(int64_t, max_positions, 0, "rows of the learned position table (0: none)")                  \
  X(bool, qk_norm, false, "RMSNorm over head_dim of each q and k head, before RoPE")

struct ModelConfig {
#define SL_CONFIG_FIELD(type, name, init, help) type name = init;
  SL_MODEL_CONFIG_FIELDS(SL_CONFIG_FIELD)
#undef SL_CONFIG_FIELD
};

// A layer's tensors, declared once: the packed matrices X(name, rows, cols) and the fp32
// vectors V(name, length), sizes in the names make_model (python/model.cpp) gives them: D
// hidden, I intermediate, QD heads * head_dim, KVD kv_heads * head_dim, HD head_dim. They make
// LayerWeights below and its Python twin (_native.LayerWeights), so a new tensor is one line.
// gate is empty unless the MLP is gated; the attention norm is required, the MLP norm too
// unless one norm is shared (Residual::Parallel); q_norm/k_norm go with qk_norm,
// attn_out_norm/mlp_out_norm with sandwich_norms; the rest (LayerNorm and linear biases) are
// optional.
#define SL_LAYER_MATRICES(X) \
  X(q, QD, D) X(k, KVD, D) X(v, KVD, D) X(o, D, QD) X(gate, I, D) X(up, I, D) X(down, D, I)
#define SL_LAYER_VECTORS(V)                                                                \
  V(attn_norm, D) V(mlp_norm, D) V(attn_norm_b, D) V(mlp_norm_b, D) V(q_norm, HD)          \
  V(k_norm, HD) V(attn_out_norm, D) V(mlp_out_norm, D) V(bq, QD) V(bk, KVD) V(bv, KVD)     \
  V(bo, D) V(bgate, I) V(bup, I) V(bdown, D)

struct LayerWeights {
#define SL_LAYER_MATRIX(name, rows, cols) Weight name;
#define SL_LAYER_VECTOR(name, length) const float* name = nullptr;
  SL_LAYER_MATRICES(SL_LAYER_MATRIX)
  SL_LAYER_VECTORS(SL_LAYER_VECTOR)
#undef SL_LAYER_MATRIX
#undef SL_LAYER_VECTOR
};

// KV cache views, written in place: fp32, IEEE half or int8 rows with their scales (ops.h).
struct KVCache {
  void* k = nullptr;  // (layers, slots, kv_heads, capacity, kv_row(head_dim)) of type `type`
  void* v = nullptr;
  int64_t slots = 0, capacity = 0;
  KvType type = KvType::F32;
};

// Non-layer weights: token (and learned position) embeddings, final norm, lm_head.
struct OuterWeights {
  Weight embed;                       // (vocab, hidden), any packed format (rows decoded)
  const float* pos_embed = nullptr;   // (max_positions, hidden) or null
  const float* final_norm = nullptr;  // (hidden,)
  const float* final_norm_b = nullptr;  // (hidden,) or null
  Weight lm_head;                     // (vocab, hidden)
  const float* lm_head_b = nullptr;   // (vocab,) or null
};

class NativeModel {
 public:
  NativeModel(ModelConfig cfg, std::vector<LayerWeights> layers, OuterWeights outer);

  // tokens, slots, positions: (T,); logit_rows: (R,) indices into the T tokens;
  // out_logits: (R, vocab). prompt: the tokens are prompt chunks, which take the prompt
  // kernels: attention in blocks of queries (AttnShape::prompt) and, with dynamic_int8, the int8
  // GEMM on quantized activations for weight-only formats (LinearScratch::prompt).
  // dynamic_int8 also lets weight-only GEMVs with a Gemv::group_int8 kernel quantize x per
  // group of columns in decode (LinearScratch::group_int8).
  // Throws std::out_of_range on bad ids / positions / slots.
  void forward(const int64_t* tokens, const int64_t* slots, const int64_t* positions, int64_t T,
               const KVCache& cache, const int64_t* logit_rows, int64_t R, float* out_logits,
               bool prompt = false, bool dynamic_int8 = true);

  const ModelConfig& config() const { return cfg_; }
  int64_t window(int64_t layer) const {
    return cfg_.layer_sliding.empty() || cfg_.layer_sliding[layer] ? cfg_.sliding_window : 0;
  }

 private:
  void norm(const float* x, const float* w, const float* b, float* out, int64_t T);
  // h_ (normed input) -> out (T, hidden): qkv, QK-norm, RoPE, cache append, attention, o_proj.
  void attention_block(const LayerWeights& w, int64_t layer, const int64_t* slots,
                       const int64_t* positions, int64_t T, const KVCache& cache, float* out);
  // h_ -> out (T, hidden)
  void mlp_block(const LayerWeights& w, int64_t T, float* out);

  ModelConfig cfg_;
  std::vector<LayerWeights> layers_;
  OuterWeights outer_;

  // Run-state buffers, sized once in the constructor (M = max_tokens).
  AlignedVector<float> x_;       // (M, hidden)        residual stream
  AlignedVector<float> h_;       // (M, hidden)        normed input of the projections
  AlignedVector<float> q_;       // (M, heads * hd)    queries (RoPE applied in place)
  AlignedVector<float> k_;       // (M, kv_heads * hd) new keys before they go to the cache
  AlignedVector<float> v_;       // (M, kv_heads * hd) new values
  AlignedVector<float> att_;     // (M, heads * hd)    attention output
  AlignedVector<float> proj_;    // (M, hidden)        o_proj / down_proj output
  AlignedVector<float> par_;     // (M, hidden)        o_proj output kept for a parallel residual
  AlignedVector<float> gate_;    // (M, intermediate)  gate_proj, then act(gate) * up
  AlignedVector<float> up_;      // (M, intermediate)  up_proj
  AlignedVector<float> cos_;     // (M, rot / 2)       RoPE tables for this call's positions
  AlignedVector<float> sin_;     // (M, rot / 2)
  AlignedVector<float> lcos_, lsin_;  // the same for local_inv_freq (sliding layers)
  AlignedVector<float> embed_row_;  // (embed.kp,)     one decoded embedding row
  AlignedVector<float> scores_;  // attention()'s scratch: scores, partial results (grown there)
  LinearScratch lin_;            // activations padding / quantization / decoded panels
  bool prompt_ = false;          // this forward's tokens are prompt chunks
};

}  // namespace sl
