// Shared helpers for the CPU kernel tests: seeded data and quantized buffers.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#if defined(__unix__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include <doctest/doctest.h>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/quants.h"
#include "kernels/weight_type.h"

namespace tandem::test {

// A float's bit pattern, and the float of a bit pattern.
inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Every weight type the CPU kernels compute with.
inline const std::vector<kernels::weight_type>& computable_types() {
  using kernels::weight_type;
  static const std::vector<weight_type> types{weight_type::f32,  weight_type::f16,  weight_type::bf16, weight_type::q4_0,
                                              weight_type::q4_1, weight_type::q5_0, weight_type::q5_1, weight_type::q8_0,
                                              weight_type::q4_k, weight_type::q5_k, weight_type::q6_k};
  return types;
}

// Gaussian samples (Box-Muller over mt19937, whose output the standard fixes), so the data
// is the same on every platform and standard library.
inline std::vector<float> gaussian(size_t n, uint32_t seed, float sigma = 1.0f, float mean = 0.0f) {
  std::mt19937 rng(seed);
  auto uniform = [&] { return (static_cast<double>(rng()) + 0.5) / 4294967296.0; };
  std::vector<float> out(n);
  for (size_t i = 0; i < n; i += 2) {
    const double r = std::sqrt(-2.0 * std::log(uniform()));
    const double t = 6.283185307179586 * uniform();
    out[i] = mean + sigma * static_cast<float>(r * std::cos(t));
    if (i + 1 < n) out[i + 1] = mean + sigma * static_cast<float>(r * std::sin(t));
  }
  return out;
}

// `rows` rows of `cols` values quantized to t, laid out as a GGUF tensor.
inline std::vector<uint8_t> quantize_matrix(kernels::weight_type t, const std::vector<float>& x, int64_t rows, int64_t cols) {
  const auto rb = static_cast<size_t>(kernels::row_bytes(t, cols));
  std::vector<uint8_t> out(rb * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) kernels::cpu::quantize_row(t, x.data() + r * cols, out.data() + r * rb, cols);
  return out;
}

inline std::vector<float> dequantize_matrix(kernels::weight_type t, const std::vector<uint8_t>& q, int64_t rows, int64_t cols) {
  const auto rb = static_cast<size_t>(kernels::row_bytes(t, cols));
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) kernels::cpu::dequantize_row(t, q.data() + r * rb, out.data() + r * cols, cols);
  return out;
}

// Restores the automatic ISA choice when a test ends, whatever it forced.
struct isa_guard {
  ~isa_guard() {
    kernels::cpu::set_isa(kernels::cpu::isa::best);
    kernels::cpu::set_avx_vnni(true);
    kernels::cpu::set_amx(true);
  }
};

// Every ISA path this CPU can run, the scalar reference first.
inline std::vector<kernels::cpu::isa> supported_isas() {
  std::vector<kernels::cpu::isa> out{kernels::cpu::isa::scalar};
  for (const auto p : {kernels::cpu::isa::avx2, kernels::cpu::isa::avx512})
    if (kernels::cpu::isa_supported(p)) out.push_back(p);
  return out;
}

#if defined(__unix__)
// `n` bytes that end where an inaccessible page begins, so a kernel that reads past the last
// row faults instead of passing by luck.
class guarded_bytes {
 public:
  explicit guarded_bytes(size_t n) {
    const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    span_ = (n + page - 1) / page * page + page;
    void* base = mmap(nullptr, span_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(base != MAP_FAILED);
    base_ = static_cast<uint8_t*>(base);
    REQUIRE(mprotect(base_ + span_ - page, page, PROT_NONE) == 0);
    data_ = base_ + span_ - page - n;
  }
  ~guarded_bytes() { munmap(base_, span_); }
  guarded_bytes(const guarded_bytes&) = delete;
  guarded_bytes& operator=(const guarded_bytes&) = delete;
  uint8_t* data() { return data_; }

 private:
  uint8_t* base_ = nullptr;
  uint8_t* data_ = nullptr;
  size_t span_ = 0;
};
#endif

}  // namespace tandem::test
