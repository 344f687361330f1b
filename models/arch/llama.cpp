// The Llama block, for llama, qwen2 and qwen3 (which differ only in data: qwen2's Q/K/V
// biases, qwen3's per-head Q/K norms, RoPE pairing in the config): a pre-norm attention
// block and a pre-norm SwiGLU feed-forward block, each added to the residual stream x.
#include "models/arch/recipes.h"

namespace tandem::models {
namespace {

void llama_layer(layer_ops& o, const model_config& c, const layer_weights& w, int64_t layer) {
  o.norm(act::x, w.attn_norm, act::xb);
  o.matmul(act::xb, {{&w.wq, act::q}, {&w.wk, act::k}, {&w.wv, act::v}});
  if (w.bq) o.add_bias(act::q, w.bq);
  if (w.bk) o.add_bias(act::k, w.bk);
  if (w.bv) o.add_bias(act::v, w.bv);
  if (w.q_norm) o.head_norm(act::q, w.q_norm, c.n_head);
  if (w.k_norm) o.head_norm(act::k, w.k_norm, c.n_head_kv);
  o.rope(act::q, c.n_head);
  o.rope(act::k, c.n_head_kv);
  o.kv_store(layer, act::k, act::v);
  o.attention(layer, act::q, act::attn);
  o.matmul(act::attn, {{&w.wo, act::xb}});
  o.add(act::x, act::xb);

  o.norm(act::x, w.ffn_norm, act::xb);
  o.matmul_swiglu(act::xb, w.w_gate, w.w_up, act::gate, act::up);
  o.matmul(act::gate, {{&w.w_down, act::xb}});
  o.add(act::x, act::xb);
}

}  // namespace

const recipe k_llama_recipe{"llama", llama_layer};

}  // namespace tandem::models
