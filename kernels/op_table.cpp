#include "kernels/op_table.h"

#include <array>
#include <stdexcept>

namespace tandem::kernels {
namespace {

using wt = weight_type;

// The CPU computes every type the foundation loads (weight_type_info::computable).
constexpr std::array k_cpu_types{wt::f32, wt::f16, wt::bf16, wt::q8_0, wt::q4_0, wt::q4_1, wt::q5_0, wt::q5_1, wt::q4_k, wt::q5_k, wt::q6_k};
// CUDA: the same types (kernels/cuda/quant_blocks.cuh decodes each); a type new to the CPU
// joins here once it has its CUDA kernels and GPU tests.
constexpr std::array k_cuda_types{wt::f32, wt::f16, wt::bf16, wt::q8_0, wt::q4_0, wt::q4_1, wt::q5_0, wt::q5_1, wt::q4_k, wt::q5_k, wt::q6_k};

constexpr std::array k_table{
    op_entry{device_kind::cpu, op::matvec, k_cpu_types.data(), k_cpu_types.size()},
    op_entry{device_kind::cpu, op::matmul, k_cpu_types.data(), k_cpu_types.size()},
    op_entry{device_kind::cpu, op::dequantize, k_cpu_types.data(), k_cpu_types.size()},
    op_entry{device_kind::cpu, op::get_rows, k_cpu_types.data(), k_cpu_types.size()},
    op_entry{device_kind::cpu, op::rms_norm, nullptr, 0},
    op_entry{device_kind::cpu, op::rope, nullptr, 0},
    op_entry{device_kind::cpu, op::swiglu, nullptr, 0},
    op_entry{device_kind::cpu, op::add, nullptr, 0},
    op_entry{device_kind::cpu, op::softmax, nullptr, 0},
    op_entry{device_kind::cpu, op::kv_store, nullptr, 0},
    op_entry{device_kind::cpu, op::attention, nullptr, 0},
    op_entry{device_kind::cpu, op::argmax, nullptr, 0},
    op_entry{device_kind::cpu, op::top_k, nullptr, 0},

    op_entry{device_kind::cuda, op::matvec, k_cuda_types.data(), k_cuda_types.size()},
    op_entry{device_kind::cuda, op::matmul, k_cuda_types.data(), k_cuda_types.size()},
    op_entry{device_kind::cuda, op::dequantize, k_cuda_types.data(), k_cuda_types.size()},
    op_entry{device_kind::cuda, op::get_rows, k_cuda_types.data(), k_cuda_types.size()},
    op_entry{device_kind::cuda, op::rms_norm, nullptr, 0},
    op_entry{device_kind::cuda, op::rope, nullptr, 0},
    op_entry{device_kind::cuda, op::swiglu, nullptr, 0},
    op_entry{device_kind::cuda, op::add, nullptr, 0},
    op_entry{device_kind::cuda, op::softmax, nullptr, 0},
    op_entry{device_kind::cuda, op::kv_store, nullptr, 0},
    op_entry{device_kind::cuda, op::attention, nullptr, 0},
    op_entry{device_kind::cuda, op::argmax, nullptr, 0},
    op_entry{device_kind::cuda, op::top_k, nullptr, 0},
};

const op_entry* find(device_kind d, op o) {
  for (const auto& e : k_table)
    if (e.device == d && e.o == o) return &e;
  return nullptr;
}

}  // namespace

bool op_takes_weights(op o) { return o == op::matvec || o == op::matmul || o == op::dequantize || o == op::get_rows; }

const op_entry* op_table(size_t* n_entries) {
  *n_entries = k_table.size();
  return k_table.data();
}

std::string_view name(device_kind d) { return d == device_kind::cpu ? "cpu" : "cuda"; }

std::string_view name(op o) {
  switch (o) {
    case op::matvec:
      return "matvec";
    case op::matmul:
      return "matmul";
    case op::dequantize:
      return "dequantize";
    case op::get_rows:
      return "get_rows";
    case op::rms_norm:
      return "rms_norm";
    case op::rope:
      return "rope";
    case op::swiglu:
      return "swiglu";
    case op::add:
      return "add";
    case op::softmax:
      return "softmax";
    case op::kv_store:
      return "kv_store";
    case op::attention:
      return "attention";
    case op::argmax:
      return "argmax";
    case op::top_k:
      return "top_k";
  }
  return "?";
}

bool supports(device_kind d, op o, weight_type t) {
  const op_entry* e = find(d, o);
  if (!e) return false;
  if (!op_takes_weights(o)) return true;
  for (size_t i = 0; i < e->n_types; ++i)
    if (e->types[i] == t) return true;
  return false;
}

void require(device_kind d, op o, weight_type t, std::string_view what) {
  if (supports(d, o, t)) return;
  std::string msg;
  if (!what.empty()) msg.append(what).append(": ");
  msg.append(name(d)).append(" ").append(name(o));
  const op_entry* e = find(d, o);
  if (!e) throw std::invalid_argument(msg + " is not implemented");
  msg.append(" has no kernel for ").append(display_name(t)).append(" (supported:");
  for (size_t i = 0; i < e->n_types; ++i) msg.append(i ? ", " : " ").append(display_name(e->types[i]));
  throw std::invalid_argument(msg + ")");
}

}  // namespace tandem::kernels
