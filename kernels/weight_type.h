// Weight (tensor element) types as numbered by GGUF / ggml, and their block geometry.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tandem::kernels {

// Values are the ggml_type ids stored in GGUF tensor infos; they must never change.
enum class weight_type : uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  q8_k = 15,
  iq2_xxs = 16,
  iq2_xs = 17,
  iq3_xxs = 18,
  iq1_s = 19,
  iq4_nl = 20,
  iq3_s = 21,
  iq2_s = 22,
  iq4_xs = 23,
  i8 = 24,
  i16 = 25,
  i32 = 26,
  i64 = 27,
  f64 = 28,
  iq1_m = 29,
  bf16 = 30,
  tq1_0 = 34,
  tq2_0 = 35,
  mxfp4 = 39,
};

struct weight_type_info {
  weight_type type;
  std::string_view name;  // lower-case ggml name, e.g. "q4_k"
  int64_t block_elems;    // elements per block along ne[0]
  int64_t block_bytes;    // bytes per block
  bool computable;        // tandem has kernels (matvec/matmul/dequantize) for it
};

// Geometry of a ggml type id; nullopt for ids ggml does not define (e.g. removed 4, 5).
std::optional<weight_type_info> find_weight_type(uint32_t id);
// Same, for a known enum value (never fails).
const weight_type_info& info(weight_type t);
// Upper-case display name ("Q4_K"), as users see it in llama.cpp's tools.
std::string display_name(weight_type t);
// Parses "q4_k", "Q4_K", "f16" ...; nullopt when unknown.
std::optional<weight_type> parse_weight_type(std::string_view name);

// Bytes of one row of `elems` elements; requires elems % block_elems == 0.
inline int64_t row_bytes(weight_type t, int64_t elems) {
  const auto& i = info(t);
  return elems / i.block_elems * i.block_bytes;
}

}  // namespace tandem::kernels
