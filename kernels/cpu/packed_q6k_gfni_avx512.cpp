// The packed Q6_K tile kernel with GFNI (vgf2p8affineqb moves each group's high bit pair into
// place in one instruction). Built with -mgfni on top of the AVX-512 flags (kernels/
// CMakeLists.txt); reached only when cpu_has_gfni().
#include <algorithm>

#include "kernels/cpu/packed.h"
#include "kernels/cpu/packed_tile_avx512.h"

namespace tandem::kernels::cpu {

void packed_dot_q6k_gfni_avx512(const uint8_t* panel, int64_t cols, const int8_t* tiled_codes, const float* tiled_aux,
                                int n_act, float* out, int64_t out_stride, int n_w) {
  const __mmask16 lanes = avx512::first16(n_w);
  for (int r0 = 0; r0 < n_act; r0 += k_panel_max_act_rows) {
    avx512::with_act_rows(std::min(k_panel_max_act_rows, n_act - r0), [&]<int R>() {
      with_requests<weight_type::q6_k, R>([&]<avx512_requests REQ>() {
        // Split does not apply to Q6_K (two sums per chunk, one per sub-block, on every CPU).
        packed_tile<weight_type::q6_k, R, REQ, true, true>(panel, cols, tiled_codes + r0 * 32,
                                                           tiled_aux + r0 * k_panel_aux_per_sub, n_act,
                                                           out + r0 * out_stride, out_stride, lanes);
      });
    });
  }
}

}  // namespace tandem::kernels::cpu
