#include "kernels/weight_type.h"

#include <doctest/doctest.h>

using namespace tandem::kernels;

TEST_SUITE("weight_type") {
  TEST_CASE("block geometry of the computable types matches ggml") {
    struct expect {
      weight_type t;
      int64_t elems, bytes;
    };
    for (auto e : {expect{weight_type::f32, 1, 4},
                   {weight_type::f16, 1, 2},
                   {weight_type::bf16, 1, 2},
                   {weight_type::q8_0, 32, 34},
                   {weight_type::q4_0, 32, 18},
                   {weight_type::q4_1, 32, 20},
                   {weight_type::q5_0, 32, 22},
                   {weight_type::q5_1, 32, 24},
                   {weight_type::q4_k, 256, 144},
                   {weight_type::q5_k, 256, 176},
                   {weight_type::q6_k, 256, 210}}) {
      CAPTURE(display_name(e.t));
      CHECK(info(e.t).block_elems == e.elems);
      CHECK(info(e.t).block_bytes == e.bytes);
      CHECK(info(e.t).computable);
    }
    CHECK(row_bytes(weight_type::q4_k, 4096) == 16 * 144);
    CHECK_FALSE(info(weight_type::q2_k).computable);
    CHECK(info(weight_type::q8_k).block_bytes == 292);
  }

  TEST_CASE("ids: known, removed and unknown") {
    CHECK(find_weight_type(12)->type == weight_type::q4_k);
    CHECK(find_weight_type(30)->type == weight_type::bf16);
    CHECK_FALSE(find_weight_type(4));   // Q4_2, removed from ggml
    CHECK_FALSE(find_weight_type(5));   // Q4_3, removed
    CHECK_FALSE(find_weight_type(31));  // never assigned
    CHECK_FALSE(find_weight_type(1000));
  }

  TEST_CASE("names parse case-insensitively and display upper-case") {
    CHECK(parse_weight_type("q4_k") == weight_type::q4_k);
    CHECK(parse_weight_type("Q6_K") == weight_type::q6_k);
    CHECK(parse_weight_type("bf16") == weight_type::bf16);
    CHECK_FALSE(parse_weight_type("q4_k_m"));
    CHECK_FALSE(parse_weight_type(""));
    CHECK(display_name(weight_type::q5_1) == "Q5_1");
  }
}
