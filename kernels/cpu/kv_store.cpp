#include "kernels/cpu/ops.h"

#include <cstring>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops_simd.h"
#include "kernels/cpu/quants.h"

namespace tandem::kernels::cpu {

void kv_store(void* cache, kv_type kt, int64_t pos, const float* rows, int64_t n, int64_t row_elems) {
  const int64_t first = pos * row_elems;
  const int64_t count = n * row_elems;
  if (kt == kv_type::f32) {
    std::memcpy(static_cast<float*>(cache) + first, rows, static_cast<size_t>(count) * sizeof(float));
    return;
  }
  // Round to nearest even, as ggml's F32 -> F16 copy into the cache does.
  uint16_t* dst = static_cast<uint16_t*>(cache) + first;
  if (active_isa() != isa::scalar) return f32_to_f16_row_avx2(rows, dst, count);
  for (int64_t i = 0; i < count; ++i) dst[i] = fp32_to_fp16(rows[i]);
}

}  // namespace tandem::kernels::cpu
