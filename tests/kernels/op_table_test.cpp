#include "kernels/op_table.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <iterator>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/weight_type.h"

using namespace tandem::kernels;

namespace {

constexpr device_kind k_devices[] = {device_kind::cpu, device_kind::cuda};

// Every op, spelled out rather than counted from the enum, so that an op added to the enum
// without a line here (and in the table) fails "every (device, op) appears once".
constexpr op k_ops[] = {op::matvec, op::matmul,  op::dequantize, op::get_rows,  op::rms_norm, op::rope, op::swiglu,
                        op::add,    op::softmax, op::kv_store,   op::attention, op::argmax,   op::top_k};

// Every weight type GGUF defines (ids 0 .. 63 cover the enum with room to spare).
std::vector<weight_type> all_weight_types() {
  std::vector<weight_type> out;
  for (uint32_t id = 0; id < 64; ++id)
    if (const auto i = find_weight_type(id)) out.push_back(i->type);
  return out;
}

const op_entry* entry(device_kind d, op o) {
  size_t n = 0;
  const op_entry* t = op_table(&n);
  for (size_t i = 0; i < n; ++i)
    if (t[i].device == d && t[i].o == o) return &t[i];
  return nullptr;
}

// The message require() throws, or "" when it accepts the pair.
std::string refusal(device_kind d, op o, weight_type t, std::string_view what = {}) {
  try {
    require(d, o, t, what);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return {};
}

}  // namespace

TEST_SUITE("op_table") {
  TEST_CASE("every (device, op) appears exactly once, CPU entries first") {
    size_t n = 0;
    const op_entry* t = op_table(&n);
    REQUIRE(t != nullptr);
    CHECK(n == std::size(k_devices) * std::size(k_ops));
    for (const auto d : k_devices)
      for (const auto o : k_ops) {
        CAPTURE(name(d));
        CAPTURE(name(o));
        size_t seen = 0;
        for (size_t i = 0; i < n; ++i) seen += t[i].device == d && t[i].o == o;
        CHECK(seen == 1);
      }
    // "CPU first": once a CUDA entry appears, no CPU entry follows.
    bool cuda_seen = false;
    for (size_t i = 0; i < n; ++i) {
      if (t[i].device == device_kind::cuda)
        cuda_seen = true;
      else
        CHECK_FALSE(cuda_seen);
    }
  }

  TEST_CASE("names are distinct and known") {
    CHECK(name(device_kind::cpu) == "cpu");
    CHECK(name(device_kind::cuda) == "cuda");
    std::set<std::string_view> names;
    for (const auto o : k_ops) {
      CHECK(name(o) != "?");
      names.insert(name(o));
    }
    CHECK(names.size() == std::size(k_ops));
  }

  TEST_CASE("ops with weights list their types (no repeats); the others list none") {
    for (const auto d : k_devices)
      for (const auto o : k_ops) {
        CAPTURE(name(d));
        CAPTURE(name(o));
        const op_entry* e = entry(d, o);
        REQUIRE(e != nullptr);
        if (!op_takes_weights(o)) {
          CHECK(e->n_types == 0);
          continue;
        }
        REQUIRE(e->n_types > 0);
        REQUIRE(e->types != nullptr);
        std::set<weight_type> distinct(e->types, e->types + e->n_types);
        CHECK(distinct.size() == e->n_types);
      }
    // The ops that take weights are exactly these four.
    for (const auto o : k_ops) {
      CAPTURE(name(o));
      CHECK(op_takes_weights(o) == (o == op::matvec || o == op::matmul || o == op::dequantize || o == op::get_rows));
    }
  }

  TEST_CASE("supports() and require() agree on every (device, op, type)") {
    const auto types = all_weight_types();
    for (const auto d : k_devices)
      for (const auto o : k_ops)
        for (const auto t : types) {
          CAPTURE(name(d));
          CAPTURE(name(o));
          CAPTURE(display_name(t));
          const op_entry* e = entry(d, o);
          REQUIRE(e != nullptr);
          bool listed = false;
          for (size_t i = 0; i < e->n_types; ++i) listed |= e->types[i] == t;
          const bool ok = supports(d, o, t);
          // The table is the only source of truth: supported means listed (or weightless).
          CHECK(ok == (listed || !op_takes_weights(o)));
          CHECK(refusal(d, o, t).empty() == ok);
        }
  }

  TEST_CASE("an unsupported pair is refused with a message naming it and listing what is supported") {
    REQUIRE_FALSE(supports(device_kind::cuda, op::matvec, weight_type::q2_k));
    CHECK_THROWS_AS(require(device_kind::cuda, op::matvec, weight_type::q2_k), std::invalid_argument);
    const std::string msg = refusal(device_kind::cuda, op::matvec, weight_type::q2_k);
    CAPTURE(msg);
    CHECK(msg.find("cuda matvec") != std::string::npos);
    CHECK(msg.find("Q2_K") != std::string::npos);
    CHECK(msg.find("supported") != std::string::npos);
    // Every supported type is listed, by its display name.
    const op_entry* e = entry(device_kind::cuda, op::matvec);
    REQUIRE(e != nullptr);
    for (size_t i = 0; i < e->n_types; ++i) CHECK(msg.find(display_name(e->types[i])) != std::string::npos);
    CHECK(msg.find("Q4_K") != std::string::npos);
    CHECK(msg.find("Q8_0") != std::string::npos);
    // Q2_K is named once, as the refused type, not among the supported ones.
    CHECK(msg.find("Q2_K") == msg.rfind("Q2_K"));

    // `what` (the tensor) comes first, so a load failure says which tensor needed the kernel.
    const std::string named = refusal(device_kind::cuda, op::matmul, weight_type::q3_k, "blk.3.ffn_down.weight");
    CAPTURE(named);
    CHECK(named.rfind("blk.3.ffn_down.weight", 0) == 0);
    CHECK(named.find("Q3_K") != std::string::npos);

    // A type no kernel computes is refused on the CPU as well.
    CHECK_FALSE(supports(device_kind::cpu, op::matvec, weight_type::q2_k));
    CHECK(refusal(device_kind::cpu, op::matvec, weight_type::q2_k).find("Q2_K") != std::string::npos);
  }

  TEST_CASE("the CPU takes exactly the computable types; CUDA takes a subset of them") {
    // Every type the loader accepts as computable must have a CPU kernel (the fallback for
    // every op), and every CPU-listed type must be one weight_type.h calls computable.
    const auto types = all_weight_types();
    for (const auto o : k_ops) {
      if (!op_takes_weights(o)) continue;
      for (const auto t : types) {
        CAPTURE(name(o));
        CAPTURE(display_name(t));
        CHECK(supports(device_kind::cpu, o, t) == info(t).computable);
        // The GPU tests compare each CUDA kernel with its CPU twin, which must therefore exist.
        if (supports(device_kind::cuda, o, t)) CHECK(supports(device_kind::cpu, o, t));
      }
    }
    // The CUDA types people run (issue 8, and the legacy ones of the demo roster) are there for
    // every weight op.
    for (const auto o : {op::matvec, op::matmul, op::dequantize, op::get_rows})
      for (const auto t : {weight_type::f32, weight_type::f16, weight_type::bf16, weight_type::q8_0, weight_type::q4_0, weight_type::q4_1,
                           weight_type::q5_0, weight_type::q5_1, weight_type::q4_k, weight_type::q5_k, weight_type::q6_k}) {
        CAPTURE(name(o));
        CAPTURE(display_name(t));
        CHECK(supports(device_kind::cuda, o, t));
      }
  }

  TEST_CASE("an op without weights accepts any type") {
    for (const auto d : k_devices)
      for (const auto o : k_ops) {
        if (op_takes_weights(o)) continue;
        for (const auto t : all_weight_types()) {
          CAPTURE(name(d));
          CAPTURE(name(o));
          CAPTURE(display_name(t));
          CHECK(supports(d, o, t));
          CHECK_NOTHROW(require(d, o, t));
        }
        CHECK(supports(d, o));  // the default type argument
      }
  }

  TEST_CASE("the CPU matmul is dispatched through the table: every listed type runs, others are refused with the list") {
    for (const auto t : all_weight_types()) {
      CAPTURE(display_name(t));
      const int64_t cols = 256;  // one block of every block size
      std::vector<std::byte> w(static_cast<size_t>(row_bytes(t, cols)) * 2, std::byte{0});
      std::vector<float> x(static_cast<size_t>(cols), 1.0f), y(2, -1.0f);
      if (supports(device_kind::cpu, op::matvec, t)) {
        CHECK_NOTHROW(cpu::matmul(t, w.data(), 2, cols, x.data(), 1, y.data(), nullptr));
      } else {
        try {
          cpu::matmul(t, w.data(), 2, cols, x.data(), 1, y.data(), nullptr);
          FAIL("no exception");
        } catch (const std::invalid_argument& e) {
          const std::string msg = e.what();
          CHECK(msg.find("cpu matvec has no kernel for " + display_name(t)) != std::string::npos);
          CHECK(msg.find("Q4_K") != std::string::npos);
        }
      }
    }
  }
}
