// The first two steps of a product (matmul_impl.h): the plan of a call, and the conversion of
// its activations into the forms the plan names.
#include "kernels/cpu/matmul_impl.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/packed.h"
#include "kernels/cpu/panel.h"
#include "kernels/op_table.h"

namespace tandem::kernels::cpu {
namespace {

// Activation elements one chunk of the activation conversion should carry at least.
constexpr int64_t k_min_chunk_convert = 16 * 1024;

}  // namespace

size_t matmul_plan::aux_bytes(int k) const { return (panel_act_aux_floats(panel_types[k], cols, n_x) * sizeof(float) + 63) / 64 * 64; }

matmul_plan plan_matmul(const matmul_job* jobs, int n_jobs, int64_t cols, int64_t n_x, bool gated) {
  if (n_jobs < 0 || n_jobs > k_max_matmul_jobs)
    throw std::invalid_argument("matmul: " + std::to_string(n_jobs) + " jobs, at most " + std::to_string(k_max_matmul_jobs));
  if (cols < 0 || n_x < 0) throw std::invalid_argument("matmul: negative shape (cols " + std::to_string(cols) + ", n_x " + std::to_string(n_x) + ")");

  matmul_plan c{};
  c.path = active_isa();
  c.amx = c.path == isa::avx512 && amx_active();
  c.cols = cols;
  c.n_x = n_x;
  c.n_jobs = n_jobs;
  // Many activation rows against quantized weights: packed panels of 16 rows (panel.h).
  const bool panel_path = c.path == isa::avx512;
  for (int j = 0; j < n_jobs; ++j) {
    const matmul_job& job = jobs[j];
    if (job.rows < 0) throw std::invalid_argument("matmul: negative shape (rows " + std::to_string(job.rows) + ")");
    // The dispatch table decides what is supported (the same message as the CUDA path).
    require(device_kind::cpu, n_x <= 1 ? op::matvec : op::matmul, job.wt, "matmul");
    const dot_kernel& kernel = find_dot_kernel(job.wt);
    const int64_t block = std::max(info(job.wt).block_elems, info(kernel.act).block_elems);
    if (cols % block != 0)
      throw std::invalid_argument("matmul: " + display_name(job.wt) + " weights need cols to be a multiple of " + std::to_string(block) + ", got " +
                                  std::to_string(cols));
    matmul_job_plan& p = c.jobs[j];
    p.kernel = &kernel;
    p.dot = select_dot(kernel, c.path);
    p.w_row = static_cast<size_t>(row_bytes(job.wt, cols));
    p.a_row = static_cast<size_t>(row_bytes(kernel.act, cols));
    p.act_slot = 0;
    while (p.act_slot < c.n_act_types && c.act_types[p.act_slot] != kernel.act) ++p.act_slot;
    if (p.act_slot == c.n_act_types) {
      c.act_types[c.n_act_types] = kernel.act;
      c.act_offsets[c.n_act_types + 1] = c.act_offsets[c.n_act_types] + p.a_row * static_cast<size_t>(n_x);
      ++c.n_act_types;
    }
    p.packed = job.layout == weight_layout::packed;
    if (p.packed && !packable(job.wt)) throw std::invalid_argument("matmul: " + display_name(job.wt) + " weights have no packed layout");
    p.panel = p.packed || (panel_path && panel_supported(job.wt) && n_x >= panel_min_act_rows(job.wt));
    p.panel_slot = 0;
    if (p.panel) {
      // The offset term panel_acts writes depends on the weight type (Q4_0 8, Q8_0 128, ...):
      // a Q8_0 job reading a Q4_0 job's form would start every integer dot wrong.
      auto same_form = [&](weight_type o) {
        return activation_type(o) == kernel.act && panel_sub_elems(o) == panel_sub_elems(job.wt) && panel_code_offset(o) == panel_code_offset(job.wt);
      };
      while (p.panel_slot < c.n_panel_slots && !same_form(c.panel_types[p.panel_slot])) ++p.panel_slot;
      if (p.panel_slot == c.n_panel_slots) c.panel_types[c.n_panel_slots++] = job.wt;
    }
    p.first_group = c.total_groups;
    const int64_t group_rows = p.panel ? k_panel_rows : k_max_weight_rows;
    p.groups = (job.rows + group_rows - 1) / group_rows;
    c.total_groups += p.groups;
  }
  // A gated call numbers row groups once for both matrices: group g is the gate's group g and
  // the up's, so every chunk holds both products of its rows when the activation runs. That
  // needs both to cut rows alike; a gate and up on different paths (one packed, one not) run
  // as two products and a separate pass instead. (Equal rows, so a call without groups stays
  // one without.)
  c.paired = gated && c.jobs[0].groups == c.jobs[1].groups && c.jobs[0].panel == c.jobs[1].panel;
  if (c.paired) {
    c.jobs[1].first_group = 0;
    c.total_groups = c.jobs[0].groups;
  }

  // Whether a packed job reads its activations in the tiled form (tile_packed_acts): the
  // AVX-512 tile kernel with several rows and no expansion.
  auto tiled_job = [&](const matmul_job& job) {
    const bool tile_order = has_ggml_order(job.wt) && job.order == sum_order::tile;
    return job.layout == weight_layout::packed && c.path == isa::avx512 && n_x > 1 && (!has_ggml_order(job.wt) || tile_order) &&
           (n_x < k_expand_min_act_rows || (tile_order && !c.amx));
  };
  // Where no job reads a slot's panel form row by row (panel_acts' layout), the rows go
  // straight into the tiled form.
  for (int j = 0; j < n_jobs; ++j) {
    if (tiled_job(jobs[j]))
      c.tiled_slot[c.jobs[j].panel_slot] = true;
    else if (c.jobs[j].panel)
      c.row_panel[c.jobs[j].panel_slot] = true;
  }
  // On AVX-512 the panel forms come straight from x (panel_act_row: one pass instead of the
  // quantizer's and panel_acts'), so an activation type is converted to its row form only for
  // the jobs that read rows.
  c.panels_from_x = c.path == isa::avx512;
  for (int j = 0; j < n_jobs; ++j)
    if (!c.panels_from_x || !c.jobs[j].panel) c.row_form[c.jobs[j].act_slot] = true;
  for (int k = 0; k < c.n_act_types; ++k) c.any_convert = c.any_convert || (c.act_types[k] != weight_type::f32 && c.row_form[k]);
  c.code_bytes = (panel_act_code_bytes(cols, n_x) + 63) / 64 * 64;
  for (int k = 0; k < c.n_panel_slots; ++k) c.panel_total += (c.code_bytes + c.aux_bytes(k)) * (c.tiled_slot[k] ? 2 : 1);
  c.act_total = (c.act_offsets[c.n_act_types] + 63) / 64 * 64;
  c.forms_bytes = c.act_total + c.panel_total;
  return c;
}

// The activations as the kernels read them: each row converted once per activation type (F32
// read in place), and per panel slot the int8 codes with {da, da * sum, offset term} per
// sub-block, plus the tiled form where a packed job reads it (groups of k_packed_max_act_rows
// rows).
void convert_activations(const matmul_plan& c, const float* x, uint8_t* at, matmul_forms& f, thread_pool* on) {
  const int64_t cols = c.cols, n_x = c.n_x;
  uint8_t* const act_base = at;
  for (int k = 0; k < c.n_act_types; ++k)
    f.act[k] = c.act_types[k] == weight_type::f32 ? reinterpret_cast<const uint8_t*>(x) : act_base + c.act_offsets[k];
  if (c.n_panel_slots > 0) {
    uint8_t* base = at + c.act_total;
    for (int k = 0; k < c.n_panel_slots; ++k) {
      f.panel_codes[k] = reinterpret_cast<int8_t*>(base);
      f.panel_aux[k] = reinterpret_cast<float*>(base + c.code_bytes);
      base += c.code_bytes + c.aux_bytes(k);
      if (c.tiled_slot[k]) {
        f.tiled_codes[k] = reinterpret_cast<int8_t*>(base);
        f.tiled_aux[k] = reinterpret_cast<float*>(base + c.code_bytes);
        base += c.code_bytes + c.aux_bytes(k);
      }
    }
  }
  if (c.any_convert) {
    run_split(on, n_x * c.n_act_types, std::max<int64_t>(1, k_min_chunk_convert / cols), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const auto k = static_cast<int>(i / n_x);
        const int64_t r = i % n_x;
        if (c.act_types[k] == weight_type::f32 || !c.row_form[k]) continue;
        const size_t a_row = static_cast<size_t>(row_bytes(c.act_types[k], cols));
        quantize_activation_row(c.act_types[k], x + r * cols, act_base + c.act_offsets[k] + r * a_row, cols);
      }
    });
  }
  if (c.n_panel_slots == 0) return;
  run_split(on, n_x * c.n_panel_slots, std::max<int64_t>(1, k_min_chunk_convert / cols), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const auto k = static_cast<int>(i / n_x);
      const int64_t r = i % n_x;
      const weight_type wt = c.panel_types[k];
      const int64_t aux_per_row = static_cast<int64_t>(panel_act_aux_floats(wt, cols, 1));
      // Group g starts after g full groups, as if its rows lay one after another.
      const int64_t g0 = r / k_packed_max_act_rows * k_packed_max_act_rows;
      const int n_group = static_cast<int>(std::min<int64_t>(k_packed_max_act_rows, n_x - g0));
      if (c.panels_from_x && c.tiled_slot[k] && !c.row_panel[k]) {
        tiled_act_row(wt, x + r * cols, cols, static_cast<int>(r - g0), n_group, f.tiled_codes[k] + g0 * cols, f.tiled_aux[k] + g0 * aux_per_row);
        continue;
      }
      if (c.panels_from_x) {
        panel_act_row(wt, x + r * cols, cols, f.panel_codes[k] + r * cols, f.panel_aux[k] + r * aux_per_row);
      } else {
        int slot = 0;
        while (c.act_types[slot] != activation_type(wt)) ++slot;
        const size_t a_row = static_cast<size_t>(row_bytes(c.act_types[slot], cols));
        panel_acts(wt, f.act[slot] + r * a_row, a_row, 1, cols, f.panel_codes[k] + r * cols, f.panel_aux[k] + r * aux_per_row);
      }
      if (c.tiled_slot[k]) {
        tile_packed_act_row(wt, cols, f.panel_codes[k] + r * cols, f.panel_aux[k] + r * aux_per_row, static_cast<int>(r - g0), n_group,
                            f.tiled_codes[k] + g0 * cols, f.tiled_aux[k] + g0 * aux_per_row);
      }
    }
  });
}

}  // namespace tandem::kernels::cpu
