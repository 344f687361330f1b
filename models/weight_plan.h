// How a model's weights are cut into segments for the memory arbiter, and where each tensor
// sits inside its segment's device form. Segments, in the order a forward pass uses them: the
// token embedding table, the layers (the last one also holds the output norm), the output
// head. A table or head larger than the largest layer is cut into pieces of whole 16-row
// panels no larger than it, each its own segment, so a model streams through a device budget
// of about one layer. A tied head is the embedding table's pieces. A segment's device form is
// what the kernels read: matrices copied from the file or repacked into panels
// (kernels/cpu/packed.h), 1-D tensors converted to F32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "models/model.h"

namespace tandem::models {

inline constexpr size_t k_absent = std::numeric_limits<size_t>::max();

enum class tensor_form : uint8_t { copy, packed, f32 };

struct placed_tensor {
  const gguf_tensor* src = nullptr;  // the bytes in the file (the disk tier)
  size_t offset = 0;                 // within the segment, 64-byte aligned
  size_t bytes = 0;                  // of the device form
  tensor_form form = tensor_form::copy;
  int64_t row0 = 0, rows = 1;  // the rows of a matrix it holds (a piece of a table)
};

struct segment_layout {
  std::string name;  // "token_embd", "blk.N", "output"
  size_t bytes = 0;
  std::vector<placed_tensor> tensors;
};

// A matrix at an offset of its segment; view.data is unset until bound to a base.
struct matrix_at {
  size_t offset = k_absent;
  weight_view view;
};

struct layer_at {
  size_t attn_norm = k_absent, bq = k_absent, bk = k_absent, bv = k_absent, q_norm = k_absent, k_norm = k_absent, ffn_norm = k_absent;
  matrix_at wq, wk, wv, wo, w_gate, w_up, w_down;
};

// Rows [row0, row0 + view.rows) of the embedding table or the output head, in one segment.
struct matrix_piece {
  int segment = 0;
  int64_t row0 = 0;
  matrix_at m;
};

struct weight_plan {
  std::vector<segment_layout> segments;
  std::vector<matrix_piece> token_embd;  // the first segments
  std::vector<layer_at> layers;          // segment first_layer + l
  int first_layer = 0;
  size_t output_norm = k_absent;     // in the last layer's segment
  std::vector<matrix_piece> output;  // the last segments; token_embd's when tied

  int layer_segment(int64_t l) const { return first_layer + static_cast<int>(l); }
  int last_segment() const { return static_cast<int>(segments.size()) - 1; }
  uint64_t total_bytes() const;
  uint64_t largest_segment() const;
};

// The plan of `m`'s file: matrices packed where options.pack_weights and the kernels gain
// from it (the same choice as a model that owns its weights, so both run the same kernels).
weight_plan make_weight_plan(const gguf_file& f, const model_config& c, const load_options& options);

// Writes a segment's device form from the file's bytes. Thread-safe (reads the mapping only).
void fill_segment(const segment_layout& s, std::byte* dst);

// Views of segment bytes at `base` (the device copy a lease gives).
weight_view bind_matrix_at(const matrix_at& m, const std::byte* base);
layer_weights bind_layer(const layer_at& l, const std::byte* base);
const float* bind_vector_at(size_t offset, const std::byte* base);

}  // namespace tandem::models
