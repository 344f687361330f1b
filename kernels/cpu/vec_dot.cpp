#include "kernels/cpu/vec_dot.h"

#include <array>
#include <stdexcept>
#include <string>

namespace tandem::kernels::cpu {
namespace {

struct entry {
  weight_type weights;
  dot_kernel kernel;
};

#define TANDEM_ROWS(f) each_weight_row<f>

// One row per weight type with kernels; the activation column mirrors activation_type().
// An avx512 column of nullptr falls back to the avx2 kernel.
const std::array<entry, 11> k_kernels{{
    {weight_type::f32, {weight_type::f32, TANDEM_ROWS(vec_dot_f32_scalar), TANDEM_ROWS(vec_dot_f32_avx2), dot_f32_avx512}},
    {weight_type::f16, {weight_type::f16, TANDEM_ROWS(vec_dot_f16_scalar), TANDEM_ROWS(vec_dot_f16_avx2), dot_f16_avx512}},
    {weight_type::bf16,
     {weight_type::bf16, TANDEM_ROWS(vec_dot_bf16_scalar), TANDEM_ROWS(vec_dot_bf16_avx2), dot_bf16_avx512, true}},
    {weight_type::q4_0, {weight_type::q8_0, TANDEM_ROWS(vec_dot_q4_0_scalar), dot_q4_0_avx2, dot_q4_0_avx512}},
    {weight_type::q4_1, {weight_type::q8_1, TANDEM_ROWS(vec_dot_q4_1_scalar), dot_q4_1_avx2, dot_q4_1_avx512}},
    {weight_type::q5_0, {weight_type::q8_0, TANDEM_ROWS(vec_dot_q5_0_scalar), dot_q5_0_avx2, dot_q5_0_avx512}},
    {weight_type::q5_1, {weight_type::q8_1, TANDEM_ROWS(vec_dot_q5_1_scalar), dot_q5_1_avx2, dot_q5_1_avx512}},
    {weight_type::q8_0, {weight_type::q8_0, TANDEM_ROWS(vec_dot_q8_0_scalar), dot_q8_0_avx2, dot_q8_0_avx512}},
    {weight_type::q4_k,
     {weight_type::q8_k, TANDEM_ROWS(vec_dot_q4_k_scalar), TANDEM_ROWS(vec_dot_q4_k_avx2), dot_q4_k_avx512}},
    {weight_type::q5_k,
     {weight_type::q8_k, TANDEM_ROWS(vec_dot_q5_k_scalar), TANDEM_ROWS(vec_dot_q5_k_avx2), dot_q5_k_avx512}},
    {weight_type::q6_k,
     {weight_type::q8_k, TANDEM_ROWS(vec_dot_q6_k_scalar), TANDEM_ROWS(vec_dot_q6_k_avx2), dot_q6_k_avx512}},
}};

#undef TANDEM_ROWS

}  // namespace

const dot_kernel& find_dot_kernel(weight_type weights) {
  for (const auto& e : k_kernels)
    if (e.weights == weights) return e.kernel;
  std::string supported;
  for (const auto& e : k_kernels) supported += (supported.empty() ? "" : ", ") + display_name(e.weights);
  throw std::invalid_argument("no CPU dot product for weight type " + display_name(weights) + " (supported: " +
                              supported + ")");
}

dot_fn select_dot(const dot_kernel& k, isa path) {
  if (path == isa::avx512 && k.avx512 && (!k.avx512_needs_bf16 || cpu_has_avx512_bf16())) return k.avx512;
  if (path == isa::avx512 || path == isa::avx2) return k.avx2;
  return k.scalar;
}

}  // namespace tandem::kernels::cpu
