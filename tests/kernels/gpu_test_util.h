// Shared by the GPU op tests (gpu_matmul_test.cpp, gpu_ops_test.cpp): the skip rule, the
// CUDA table's types per op, device arrays poisoned with 0xFF bytes plus a guard tail, and the
// error ratio. CUDA builds only.
#pragma once

#if defined(TANDEM_HAVE_CUDA)

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <iterator>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quants.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/op_table.h"
#include "kernels/weight_type.h"
#include "tests/kernels/kernel_test_util.h"

namespace tandem::test::gpu {

namespace cu = tandem::kernels::cuda;
namespace cpu = tandem::kernels::cpu;
using tandem::kernels::display_name;
using tandem::kernels::info;
using tandem::kernels::row_bytes;
using tandem::kernels::weight_type;
using tandem::test::gaussian;

// Whether a device answers; if not, says why. Under CTest's kernels_gpu entry
// (TANDEM_GPU_ENTRY set) the process exits 77 instead, which CTest reports as skipped.
inline bool device_or_skip() {
  std::string why;
  if (cu::device_available(&why)) return true;
  if (std::getenv("TANDEM_GPU_ENTRY")) {
    std::cerr << "SKIPPED: " << why << "\n";
    std::exit(77);
  }
  MESSAGE("skipped: " << why);
  return false;
}

// The weight types the CUDA table lists for `o`: a type added there is tested here.
inline std::vector<weight_type> cuda_types(tandem::kernels::op o) {
  size_t n = 0;
  const auto* t = tandem::kernels::op_table(&n);
  for (size_t i = 0; i < n; ++i)
    if (t[i].device == tandem::kernels::device_kind::cuda && t[i].o == o) return std::vector<weight_type>(t[i].types, t[i].types + t[i].n_types);
  return {};
}

template <class T>
bool all_ff(const T& v) {
  unsigned char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  return std::all_of(b, b + sizeof(T), [](unsigned char c) { return c == 0xFF; });
}

// Elements after the end of every device array, left as 0xFF bytes and checked afterwards.
constexpr size_t k_guard = 64;

// n elements of T on the device plus a guard tail, all 0xFF bytes (NaN for floats, -1 for
// int32) unless filled from the host.
template <class T>
class dev_array {
 public:
  dev_array(size_t n, const cu::stream& s) : n_(n), buf_((n + k_guard) * sizeof(T)), s_(s) {
    cu::fill_bytes(buf_.get(), 0xFF, buf_.size(), s_.get());
  }
  // Synchronises after the copy, so the host vector may go at once.
  dev_array(const std::vector<T>& v, const cu::stream& s) : dev_array(v.size(), s) {
    if (!v.empty()) cu::copy_to_device(buf_.get(), v.data(), v.size() * sizeof(T), s_.get());
    s_.synchronize();
  }
  T* get() const { return buf_.as<T>(); }
  size_t size() const { return n_; }

  // The n elements once the stream's work is done. Checks that the guard is intact (nothing
  // written past the end) and, with all_written, that every element was written (none kept
  // the poison) and that no float is NaN.
  std::vector<T> read(bool all_written = true) const {
    std::vector<T> all(n_ + k_guard);
    cu::copy_to_host(all.data(), buf_.get(), all.size() * sizeof(T), s_.get());
    s_.synchronize();
    size_t past_end = 0;
    for (size_t i = n_; i < all.size(); ++i) past_end += !all_ff(all[i]);
    CHECK_MESSAGE(past_end == 0, "elements written past the end");
    all.resize(n_);
    if (all_written) {
      size_t untouched = 0, nans = 0;
      for (const T& v : all) {
        untouched += all_ff(v);
        if constexpr (std::is_floating_point_v<T>) nans += std::isnan(v);
      }
      CHECK_MESSAGE(untouched == 0, "elements left unwritten");
      CHECK(nans == 0);
    }
    return all;
  }

 private:
  size_t n_;
  cu::device_buffer buf_;
  const cu::stream& s_;
};

// Largest |a - b| / (rel * |b| + abs) over the elements: <= 1 passes.
inline double worst_ratio(const std::vector<float>& a, const std::vector<float>& b, double rel, double abs) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])) / (rel * std::fabs(double(b[i])) + abs));
  return worst;
}

}  // namespace tandem::test::gpu

#endif
