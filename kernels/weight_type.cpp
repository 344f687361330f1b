#include "kernels/weight_type.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>

namespace tandem::kernels {
namespace {

using wt = weight_type;
// Block geometry from ggml-common.h; "computable" marks the types tandem can run.
constexpr std::array<weight_type_info, 32> k_types{{
    {wt::f32, "f32", 1, 4, true},
    {wt::f16, "f16", 1, 2, true},
    {wt::q4_0, "q4_0", 32, 18, true},
    {wt::q4_1, "q4_1", 32, 20, true},
    {wt::q5_0, "q5_0", 32, 22, true},
    {wt::q5_1, "q5_1", 32, 24, true},
    {wt::q8_0, "q8_0", 32, 34, true},
    {wt::q8_1, "q8_1", 32, 36, false},
    {wt::q2_k, "q2_k", 256, 84, false},
    {wt::q3_k, "q3_k", 256, 110, false},
    {wt::q4_k, "q4_k", 256, 144, true},
    {wt::q5_k, "q5_k", 256, 176, true},
    {wt::q6_k, "q6_k", 256, 210, true},
    {wt::q8_k, "q8_k", 256, 292, false},
    {wt::iq2_xxs, "iq2_xxs", 256, 66, false},
    {wt::iq2_xs, "iq2_xs", 256, 74, false},
    {wt::iq3_xxs, "iq3_xxs", 256, 98, false},
    {wt::iq1_s, "iq1_s", 256, 50, false},
    {wt::iq4_nl, "iq4_nl", 32, 18, false},
    {wt::iq3_s, "iq3_s", 256, 110, false},
    {wt::iq2_s, "iq2_s", 256, 82, false},
    {wt::iq4_xs, "iq4_xs", 256, 136, false},
    {wt::i8, "i8", 1, 1, false},
    {wt::i16, "i16", 1, 2, false},
    {wt::i32, "i32", 1, 4, false},
    {wt::i64, "i64", 1, 8, false},
    {wt::f64, "f64", 1, 8, false},
    {wt::iq1_m, "iq1_m", 256, 56, false},
    {wt::bf16, "bf16", 1, 2, true},
    {wt::tq1_0, "tq1_0", 256, 54, false},
    {wt::tq2_0, "tq2_0", 256, 66, false},
    {wt::mxfp4, "mxfp4", 32, 17, false},
}};

}  // namespace

std::optional<weight_type_info> find_weight_type(uint32_t id) {
  for (const auto& t : k_types)
    if (static_cast<uint32_t>(t.type) == id) return t;
  return std::nullopt;
}

const weight_type_info& info(weight_type t) {
  for (const auto& i : k_types)
    if (i.type == t) return i;
  return k_types[0];  // unreachable for valid enum values
}

std::string display_name(weight_type t) {
  std::string s(info(t).name);
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::optional<weight_type> parse_weight_type(std::string_view name) {
  std::string lower(name);
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const auto& i : k_types)
    if (i.name == lower) return i.type;
  return std::nullopt;
}

}  // namespace tandem::kernels
