// AVX2 products over packed weights: the dispatch between the plain kernels and the AVX-VNNI
// ones (both from packed_tile_avx2.h).
#include "kernels/cpu/isa.h"
#include "kernels/cpu/packed.h"
#include "kernels/cpu/packed_tile_avx2.h"

namespace tandem::kernels::cpu {

void packed_dot_avx2(weight_type wt, const uint8_t* panel, int64_t cols, const int8_t* codes, const float* aux, int n_act, float* out,
                     int64_t out_stride, int n_w, sum_order order, bool allow_vnni) {
  if (allow_vnni && avx_vnni_active()) {
    packed_dot_avxvnni(wt, panel, cols, codes, aux, n_act, out, out_stride, n_w, order);
    return;
  }
  packed_dot_avx2_impl<false>(wt, panel, cols, codes, aux, n_act, out, out_stride, n_w, order);
}

}  // namespace tandem::kernels::cpu
