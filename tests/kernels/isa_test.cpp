#include "kernels/cpu/isa.h"

#include <doctest/doctest.h>

#include <cpuid.h>

#include <string_view>

namespace cpu = tandem::kernels::cpu;

TEST_CASE("this_cpu reads the vendor, family and model cpuid reports") {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  REQUIRE(__get_cpuid(0, &eax, &ebx, &ecx, &edx) != 0);
  char vendor[13] = {};
  for (int i = 0; i < 4; ++i) {
    vendor[i] = static_cast<char>(ebx >> (8 * i));
    vendor[4 + i] = static_cast<char>(edx >> (8 * i));
    vendor[8 + i] = static_cast<char>(ecx >> (8 * i));
  }
  const cpu::cpu_identity id = cpu::this_cpu();
  CHECK(id.amd == (std::string_view(vendor) == "AuthenticAMD"));
  REQUIRE(__get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0);
  // Base family 15 means the extended family is added (AMD since K8); Intel cores mostly report 6.
  const unsigned base_family = eax >> 8 & 0xFu;
  CHECK(id.family >= base_family);
  if (base_family == 0xFu) {
    const unsigned family = 0xFu + (eax >> 20 & 0xFFu), extended_model = eax >> 16 & 0xFu;
    CHECK(id.family == family);
    const unsigned model_high = id.model >> 4;
    CHECK(model_high == extended_model);
  }
  const unsigned base_model = eax >> 4 & 0xFu;
  CHECK((id.model & 0xFu) == base_model);
  CHECK(cpu::this_cpu().family == id.family);  // stable across calls
}

TEST_CASE("AMX: present only with AVX-512 and the CPU's AMX-INT8 bits; set_amx gates it; reports name it") {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool bits = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) != 0 && (edx >> 24 & 1u) != 0 && (edx >> 25 & 1u) != 0;
  if (cpu::cpu_has_amx()) {
    CHECK(bits);
    CHECK(cpu::isa_supported(cpu::isa::avx512));
  }
  const cpu::isa before = cpu::requested_isa();
  cpu::set_amx(false);
  CHECK_FALSE(cpu::amx_active());
  CHECK(std::string_view(cpu::active_path_name()) != "amx");
  cpu::set_amx(true);
  CHECK(cpu::amx_active() == (cpu::cpu_has_amx() && cpu::active_isa() == cpu::isa::avx512));
  if (cpu::amx_active()) CHECK(std::string_view(cpu::active_path_name()) == "amx");
  cpu::set_isa(cpu::isa::scalar);  // another path never takes the tiles
  CHECK_FALSE(cpu::amx_active());
  CHECK(std::string_view(cpu::active_path_name()) == "scalar");
  cpu::set_isa(before);
}
