// The AVX-VNNI build of the AVX2 packed kernels (packed_tile_avx2.h); compiled with -mavxvnni
// (kernels/CMakeLists.txt) and only called where the CPU has it (avx_vnni_active).
#include "kernels/cpu/packed.h"
#include "kernels/cpu/packed_tile_avx2.h"

namespace tandem::kernels::cpu {

void packed_dot_avxvnni(weight_type wt, const uint8_t* panel, int64_t cols, const int8_t* codes, const float* aux, int n_act, float* out,
                        int64_t out_stride, int n_w, sum_order order) {
  packed_dot_avx2_impl<true>(wt, panel, cols, codes, aux, n_act, out, out_stride, n_w, order);
}

}  // namespace tandem::kernels::cpu
