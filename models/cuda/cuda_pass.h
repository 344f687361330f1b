// The CUDA backend of a recipe (models/recipe.h): one pass of a gpu_forward over the kernels
// of kernels/cuda/, every op queued on the pass's stream. Internal to models/cuda/.
#pragma once

#include <cstdint>

#include "kernels/cpu/ops.h"
#include "models/cuda/gpu_state.h"
#include "models/model.h"
#include "models/recipe_runner.h"

namespace tandem::models {

class cuda_pass final : public pass_backend, public layer_ops {
 public:
  // Rows r < n of the pass: their positions and block tables are on the device already
  // (d.pos, d.table_of_row, d.tables). tokens: the rows' tokens (host). The logits of rows
  // out_rows[0 .. n_out) go to d.logits.
  cuda_pass(const model_config& c, gpu_device_state& d, const cu::stream& s, const kernels::cpu::rope_params& rope, kernels::cpu::kv_type kv,
            bool kv_rotate, std::byte* kv_base, int64_t block_tokens, const int32_t* tokens, int64_t n, const int64_t* out_rows, int64_t n_out,
            int64_t max_rows);

  // pass_backend
  void embed(const weight_view& table, int64_t row0) override;
  void run_layer(int64_t, layer_body body) override { body(*this); }
  void output_norm(const float* w) override;
  void head(const weight_view& head, int64_t col0) override;
  bool asynchronous() const override { return true; }
  void drain() override;
  void mark(int slot) override;
  void wait_mark(int slot) override;

  // layer_ops
  void norm(act in, const float* w, act out) override;
  void matmul(act in, std::initializer_list<product> products) override;
  void matmul_swiglu(act in, const weight_view& w_gate, const weight_view& w_up, act gate, act up) override;
  void add_bias(act a, const float* b) override;
  void head_norm(act a, const float* w, int64_t n_heads) override;
  void rope(act a, int64_t n_heads) override;
  void kv_store(int64_t layer, act k, act v) override;
  void attention(int64_t layer, act q, act out) override;
  void add(act dst, act src) override;

 private:
  float* buf(act a) const;
  int64_t width(act a) const;
  void mat(const weight_view& w, const float* x, int64_t n_x, float* y);
  cu::paged_layer layer_of(int64_t layer) const;
  void rotate(act a, int64_t n_heads);  // through the Hadamard rotation where the cache is rotated

  const model_config& c_;
  gpu_device_state& d_;
  const cu::stream& st_;
  cu::stream_t s_;
  const kernels::cpu::rope_params& rope_;
  kernels::cpu::kv_type kv_;
  bool kv_rotate_;  // K, V and Q rotated per head, the attention output rotated back
  std::byte* kv_base_;
  int64_t block_tokens_;
  const int32_t* tokens_;
  int64_t n_;
  const int64_t* out_rows_;
  int64_t n_out_;
  int64_t max_rows_;
  int embed_pieces_ = 0;  // embed() calls so far: each piece's ids have their own staging
  cu::row_map rows_;
};

}  // namespace tandem::models
