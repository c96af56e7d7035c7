// NativeModel: a whole Llama-family forward (embedding -> layers -> final norm -> lm_head) in
// one native call, over a flat batch of T tokens from any number of sequences (twin of
// sparsellm.models.llama.LlamaModel.forward). Weights are non-owning views (the Python wrapper
// keeps the packed buffers alive); run-state buffers are allocated once for max_tokens, so a
// forward call allocates nothing.
#pragma once

#include <vector>

#include "common.h"
#include "linear.h"

namespace sl {

struct ModelConfig {
  int64_t hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t vocab = 0;
  float eps = 1e-6f;
  int64_t sliding_window = 0;  // 0: full causal attention
  int64_t max_tokens = 0;      // largest T of one forward call (buffers are sized for it)
  std::vector<double> inv_freq;  // (head_dim/2,) RoPE inverse frequencies
};

struct LayerWeights {
  Weight q, k, v, o, gate, up, down;
  const float* attn_norm = nullptr;  // (hidden,)
  const float* mlp_norm = nullptr;   // (hidden,)
  const float *bq = nullptr, *bk = nullptr, *bv = nullptr, *bo = nullptr;  // optional biases
};

// KV cache views: (layers, slots, kv_heads, capacity, head_dim) fp32, written in place.
struct KVCache {
  float* k = nullptr;
  float* v = nullptr;
  int64_t slots = 0, capacity = 0;
};

class NativeModel {
 public:
  NativeModel(ModelConfig cfg, std::vector<LayerWeights> layers, const float* embed,
              const float* final_norm, Weight lm_head);

  // tokens, slots, positions: (T,); logit_rows: (R,) indices into the T tokens;
  // out_logits: (R, vocab). Throws std::out_of_range on bad ids / positions / slots.
  void forward(const int64_t* tokens, const int64_t* slots, const int64_t* positions, int64_t T,
               const KVCache& cache, const int64_t* logit_rows, int64_t R, float* out_logits);

  const ModelConfig& config() const { return cfg_; }

 private:
  void attention_block(const LayerWeights& w, int64_t layer, const int64_t* slots,
                       const int64_t* positions, int64_t T, const KVCache& cache);
  void mlp_block(const LayerWeights& w, int64_t T);

  ModelConfig cfg_;
  std::vector<LayerWeights> layers_;
  const float* embed_;       // (vocab, hidden)
  const float* final_norm_;  // (hidden,)
  Weight lm_head_;           // (vocab, hidden)

  // Run-state buffers, sized once in the constructor (M = max_tokens).
  std::vector<float> x_;     // (M, hidden)        residual stream
  std::vector<float> h_;     // (M, hidden)        RMS-normed input of the projections
  std::vector<float> q_;     // (M, heads * hd)    queries (RoPE applied in place)
  std::vector<float> k_;     // (M, kv_heads * hd) new keys before they go to the cache
  std::vector<float> v_;     // (M, kv_heads * hd) new values
  std::vector<float> att_;   // (M, heads * hd)    attention output
  std::vector<float> proj_;  // (M, hidden)        o_proj / down_proj output
  std::vector<float> gate_;  // (M, intermediate)  gate_proj, then silu(gate) * up
  std::vector<float> up_;    // (M, intermediate)  up_proj
  std::vector<float> cos_;   // (M, hd / 2)        RoPE tables for this call's positions
  std::vector<float> sin_;   // (M, hd / 2)
  std::vector<float> scores_;  // (threads, capacity) attention scores (grown on first use)
  LinearScratch lin_;          // activations padding / quantization / decoded panels
};

}  // namespace sl
