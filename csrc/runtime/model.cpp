// NativeModel forward: the math of sparsellm.models.decoder.DecoderModel.forward, one call per
// step. The spec flags select branches once per layer (never per element), so the Llama path
// does the same work as before they existed.
#include "model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "formats.h"
#include "ops.h"

namespace sl {

NativeModel::NativeModel(ModelConfig cfg, std::vector<LayerWeights> layers, OuterWeights outer)
    : cfg_(std::move(cfg)), layers_(std::move(layers)), outer_(outer) {
  const ModelConfig& c = cfg_;
  if (c.heads % c.kv_heads) throw std::invalid_argument("heads must be a multiple of kv_heads");
  if (int64_t(layers_.size()) != c.layers) throw std::invalid_argument("layer count mismatch");
  if (c.rotary_dim % 2 || c.rotary_dim < 0 || c.rotary_dim > c.head_dim)
    throw std::invalid_argument("rotary_dim must be even and in [0, head_dim]");
  if (int64_t(c.inv_freq.size()) != c.rotary_dim / 2)
    throw std::invalid_argument("inv_freq must have rotary_dim/2 entries");
  if (!c.local_inv_freq.empty() && int64_t(c.local_inv_freq.size()) != c.rotary_dim / 2)
    throw std::invalid_argument("local_inv_freq must be empty or have rotary_dim/2 entries");
  if (!c.layer_sliding.empty() && int64_t(c.layer_sliding.size()) != c.layers)
    throw std::invalid_argument("layer_sliding must be empty or have one entry per layer");
  if ((c.max_positions > 0) != (outer_.pos_embed != nullptr))
    throw std::invalid_argument("learned positions need both max_positions and pos_embed");
  const int64_t M = c.max_tokens, D = c.hidden, qd = c.heads * c.head_dim,
                kvd = c.kv_heads * c.head_dim;
  x_.resize(M * D);
  h_.resize(M * D);
  q_.resize(M * qd);
  k_.resize(M * kvd);
  v_.resize(M * kvd);
  att_.resize(M * qd);
  proj_.resize(M * D);
  if (c.residual != Residual::Sequential) par_.resize(M * D);
  if (c.gated) gate_.resize(M * c.intermediate);
  up_.resize(M * c.intermediate);
  if (outer_.embed.rows != c.vocab || outer_.embed.cols != D)
    throw std::invalid_argument("embed must be (vocab, hidden)");
  embed_row_.resize(outer_.embed.kp);
  cos_.resize(M * c.rotary_dim / 2);
  sin_.resize(M * c.rotary_dim / 2);
  if (!c.local_inv_freq.empty()) {
    lcos_.resize(M * c.rotary_dim / 2);
    lsin_.resize(M * c.rotary_dim / 2);
  }
  // Size linear()'s scratch for the widest input of any projection (incl. lm_head).
  int64_t kp = outer_.lm_head.kp;
  for (const LayerWeights& l : layers_)
    for (const Weight* w : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down})
      kp = std::max(kp, w->kp);
  lin_.reserve(M, kp);
}

static void add_bias(float* y, const float* b, int64_t T, int64_t n) {
  if (!b) return;
  for (int64_t t = 0; t < T; ++t) add_inplace(y + t * n, b, n);
}

void NativeModel::norm(const float* x, const float* w, const float* b, float* out, int64_t T) {
  if (cfg_.layer_norm) layer_norm(x, w, b, out, T, cfg_.hidden, cfg_.eps);
  else rms_norm(x, w, out, T, cfg_.hidden, cfg_.eps);
}

void NativeModel::attention_block(const LayerWeights& w, int64_t layer, const int64_t* slots,
                                  const int64_t* positions, int64_t T, const KVCache& cache,
                                  float* out) {
  const ModelConfig& c = cfg_;
  const int64_t D = c.hidden, H = c.heads, KV = c.kv_heads, hd = c.head_dim;
  const Weight* qkv[3] = {&w.q, &w.k, &w.v};
  float* qkv_out[3] = {q_.data(), k_.data(), v_.data()};
  linear_multi(qkv, qkv_out, 3, h_.data(), T, D, lin_);
  add_bias(q_.data(), w.bq, T, H * hd);
  add_bias(k_.data(), w.bk, T, KV * hd);
  add_bias(v_.data(), w.bv, T, KV * hd);
  if (c.qk_norm) {  // every head's row of head_dim values normed on its own (rows of q_, k_)
    rms_norm(q_.data(), w.q_norm, q_.data(), T * H, hd, c.eps);
    rms_norm(k_.data(), w.k_norm, k_.data(), T * KV, hd, c.eps);
  }
  const int64_t window = this->window(layer);
  const bool local = window && !c.local_inv_freq.empty();
  const float* cs = (local ? lcos_ : cos_).data();
  const float* sn = (local ? lsin_ : sin_).data();
  apply_rope(q_.data(), T, H, hd, c.rotary_dim, H * hd, cs, sn);
  apply_rope(k_.data(), T, KV, hd, c.rotary_dim, KV * hd, cs, sn);

  // Append this step's keys/values: cache[layer, slot, kvh, pos, :] (layout (L, S, KV, cap, row)).
  const int64_t row = kv_row_bytes(cache.type, hd);
  const int64_t layer_bytes = cache.slots * KV * cache.capacity * row;
  char* kc = static_cast<char*>(cache.k) + layer * layer_bytes;
  char* vc = static_cast<char*>(cache.v) + layer * layer_bytes;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < KV; ++h) {
      const int64_t dst = ((slots[t] * KV + h) * cache.capacity + positions[t]) * row;
      const float* kn = k_.data() + (t * KV + h) * hd;
      const float* vn = v_.data() + (t * KV + h) * hd;
      switch (cache.type) {
        case KvType::F32:
          std::memcpy(kc + dst, kn, hd * sizeof(float));
          std::memcpy(vc + dst, vn, hd * sizeof(float));
          break;
        case KvType::F16:
          to_half(kn, reinterpret_cast<uint16_t*>(kc + dst), hd);
          to_half(vn, reinterpret_cast<uint16_t*>(vc + dst), hd);
          break;
        case KvType::I8:
          to_kv_int8(kn, hd, reinterpret_cast<int8_t*>(kc + dst));
          to_kv_int8(vn, hd, reinterpret_cast<int8_t*>(vc + dst));
          break;
      }
    }

  const float scale = c.attn_scale > 0 ? c.attn_scale : 1.0f / std::sqrt(float(hd));
  const AttnShape s{T, H, KV, hd, cache.capacity, scale, window, cache.type, prompt_};
  attention(q_.data(), H * hd, kc, vc, slots, positions, s, att_.data(), H * hd, scores_);
  linear(w.o, att_.data(), T, H * hd, out, D, lin_);
  add_bias(out, w.bo, T, D);
}

void NativeModel::mlp_block(const LayerWeights& w, int64_t T, float* out) {
  const ModelConfig& c = cfg_;
  const int64_t D = c.hidden, I = c.intermediate;
  float* act = up_.data();
  if (c.gated) {
    const Weight* gu[2] = {&w.gate, &w.up};
    float* gu_out[2] = {gate_.data(), up_.data()};
    linear_multi(gu, gu_out, 2, h_.data(), T, D, lin_);
    add_bias(gate_.data(), w.bgate, T, I);
    add_bias(up_.data(), w.bup, T, I);
    if (c.act == Activation::Silu) {
      swiglu(gate_.data(), up_.data(), gate_.data(), T * I);
    } else {
      activation(gate_.data(), T * I, c.act);
      for (int64_t i = 0; i < T * I; ++i) gate_[i] *= up_[i];
    }
    act = gate_.data();
  } else {
    linear(w.up, h_.data(), T, D, up_.data(), I, lin_);
    add_bias(up_.data(), w.bup, T, I);
    activation(up_.data(), T * I, c.act);
  }
  linear(w.down, act, T, I, out, D, lin_);
  add_bias(out, w.bdown, T, D);
}

void NativeModel::forward(const int64_t* tokens, const int64_t* slots, const int64_t* positions,
                          int64_t T, const KVCache& cache, const int64_t* logit_rows, int64_t R,
                          float* out_logits, bool prompt, bool dynamic_int8) {
  const ModelConfig& c = cfg_;
  prompt_ = prompt;
  lin_.prompt = prompt && dynamic_int8;
  lin_.group_int8 = dynamic_int8;
  if (T < 1 || T > c.max_tokens)
    throw std::out_of_range("forward: T=" + std::to_string(T) + " not in [1, max_tokens=" +
                            std::to_string(c.max_tokens) + "]");
  if (R > c.max_tokens) throw std::out_of_range("forward: more logit rows than max_tokens");
  for (int64_t t = 0; t < T; ++t) {
    if (tokens[t] < 0 || tokens[t] >= c.vocab)
      throw std::out_of_range("forward: token id " + std::to_string(tokens[t]) + " not in vocab");
    if (slots[t] < 0 || slots[t] >= cache.slots)
      throw std::out_of_range("forward: slot " + std::to_string(slots[t]) + " not in the cache");
    if (positions[t] < 0 || positions[t] >= cache.capacity)
      throw std::out_of_range("forward: position " + std::to_string(positions[t]) +
                              " beyond the cache capacity " + std::to_string(cache.capacity));
    if (c.max_positions && positions[t] >= c.max_positions)
      throw std::out_of_range("forward: position " + std::to_string(positions[t]) +
                              " beyond the " + std::to_string(c.max_positions) +
                              " learned positions");
  }
  for (int64_t i = 0; i < R; ++i)
    if (logit_rows[i] < 0 || logit_rows[i] >= T) throw std::out_of_range("forward: logit row");

  const int64_t D = c.hidden;
  for (int64_t t = 0; t < T; ++t) {
    decode_rows(outer_.embed, tokens[t], tokens[t] + 1, embed_row_.data());
    float* xt = x_.data() + t * D;
    std::memcpy(xt, embed_row_.data(), D * sizeof(float));
    if (c.embed_scale != 1.0f)
      for (int64_t i = 0; i < D; ++i) xt[i] *= c.embed_scale;
    if (outer_.pos_embed) add_inplace(x_.data() + t * D, outer_.pos_embed + positions[t] * D, D);
  }
  rope_tables(positions, T, c.inv_freq.data(), c.rotary_dim / 2, cos_.data(), sin_.data());
  if (!c.local_inv_freq.empty())
    rope_tables(positions, T, c.local_inv_freq.data(), c.rotary_dim / 2, lcos_.data(),
                lsin_.data());
  for (int64_t l = 0; l < c.layers; ++l) {
    const LayerWeights& w = layers_[l];
    norm(x_.data(), w.attn_norm, w.attn_norm_b, h_.data(), T);
    if (c.residual == Residual::Sequential) {
      attention_block(w, l, slots, positions, T, cache, proj_.data());
      if (c.sandwich_norms) norm(proj_.data(), w.attn_out_norm, nullptr, proj_.data(), T);
      add_inplace(x_.data(), proj_.data(), T * D);
      norm(x_.data(), w.mlp_norm, w.mlp_norm_b, h_.data(), T);
      mlp_block(w, T, proj_.data());
      if (c.sandwich_norms) norm(proj_.data(), w.mlp_out_norm, nullptr, proj_.data(), T);
      add_inplace(x_.data(), proj_.data(), T * D);
    } else {
      attention_block(w, l, slots, positions, T, cache, par_.data());
      if (c.residual == Residual::ParallelTwoNorms)
        norm(x_.data(), w.mlp_norm, w.mlp_norm_b, h_.data(), T);
      mlp_block(w, T, proj_.data());  // reads h_: the shared norm's output, or the second norm
      add_inplace(x_.data(), par_.data(), T * D);
      add_inplace(x_.data(), proj_.data(), T * D);
    }
  }
  // Final norm and lm_head only for the rows whose logits are wanted (usually the last token
  // of each sequence): h_[i] = norm(x_[logit_rows[i]]).
  for (int64_t i = 0; i < R; ++i)
    std::memcpy(proj_.data() + i * D, x_.data() + logit_rows[i] * D, D * sizeof(float));
  norm(proj_.data(), outer_.final_norm, outer_.final_norm_b, h_.data(), R);
  if (R > 0) {
    linear(outer_.lm_head, h_.data(), R, D, out_logits, c.vocab, lin_);
    add_bias(out_logits, outer_.lm_head_b, R, c.vocab);
    if (c.final_logit_softcap > 0) {
      const float cap = c.final_logit_softcap;
      for (int64_t i = 0; i < R * c.vocab; ++i)
        out_logits[i] = cap * std::tanh(out_logits[i] / cap);
    }
  }
}

}  // namespace sl
