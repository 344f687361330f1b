#include "kernels/cpu/isa.h"

#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <atomic>
#include <stdexcept>
#include <string>

namespace tandem::kernels::cpu {
namespace {

bool cpu_has_avx2() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return ok;
}

bool cpu_has_avx512() {
  static const bool ok = cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
  return ok;
}

std::atomic<isa> g_isa{isa::best};
std::atomic<bool> g_avx_vnni{true};
std::atomic<bool> g_amx{true};

// XCR0: the register state the operating system saves, so lets programs use.
unsigned long long xcr0() {
  unsigned eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return static_cast<unsigned long long>(edx) << 32 | eax;
}

}  // namespace

const char* isa_requirement(isa which) {
  switch (which) {
    case isa::avx512:
      return "AVX-512 F/BW/VL/DQ and VNNI";
    case isa::avx2:
      return "AVX2, FMA and F16C";
    default:
      return "nothing";
  }
}

bool isa_supported(isa which) {
  switch (which) {
    case isa::avx2:
      return cpu_has_avx2();
    case isa::avx512:
      return cpu_has_avx512();
    case isa::scalar:
    case isa::best:
      return true;
  }
  return false;
}

bool cpu_has_avx512_bf16() {
  static const bool ok = cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
  return ok;
}

bool cpu_has_prefetchw() {
  static const bool ok = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(0x80000001u, &eax, &ebx, &ecx, &edx) != 0 && (ecx >> 8 & 1u) != 0;
  }();
  return ok;
}

bool cpu_has_avx_vnni() {
  // CPUID leaf 7, sub-leaf 1, EAX bit 4, read directly: not every compiler's
  // __builtin_cpu_supports knows "avxvnni" (clang 14 does not). OS support for ymm state is
  // part of the AVX2 check.
  static const bool ok = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return cpu_has_avx2() && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0 && (eax >> 4 & 1u) != 0;
  }();
  return ok;
}

void set_avx_vnni(bool allowed) { g_avx_vnni.store(allowed, std::memory_order_relaxed); }
bool avx_vnni_allowed() { return g_avx_vnni.load(std::memory_order_relaxed); }
bool avx_vnni_active() { return cpu_has_avx_vnni() && avx_vnni_allowed(); }

bool cpu_has_amx() {
  static const bool ok = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    // CPUID leaf 7: EDX bit 24 AMX-TILE, bit 25 AMX-INT8; OSXSAVE (leaf 1 ECX bit 27) for xgetbv.
    if (!cpu_has_avx512() || __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
    if ((edx >> 24 & 1u) == 0 || (edx >> 25 & 1u) == 0) return false;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || (ecx >> 27 & 1u) == 0) return false;
    // XCR0 bits 17 (tile configuration) and 18 (tile data).
    if ((xcr0() >> 17 & 3u) != 3u) return false;
#if defined(__linux__)
    // Linux hands out the 8 KiB of tile data per thread only on request (kernel 5.16 on);
    // without it the first tile instruction faults. 0x1023: ARCH_REQ_XCOMP_PERM, 18: XTILEDATA.
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
    return false;
#endif
  }();
  return ok;
}

void set_amx(bool allowed) { g_amx.store(allowed, std::memory_order_relaxed); }
bool amx_allowed() { return g_amx.load(std::memory_order_relaxed); }
bool amx_active() { return active_isa() == isa::avx512 && amx_allowed() && cpu_has_amx(); }

const char* active_path_name() {
  const isa which = active_isa();
  if (which == isa::avx2 && avx_vnni_active()) return "avxvnni";
  if (which == isa::avx512 && amx_active()) return "amx";
  return isa_name(which);
}

void set_isa(isa which) {
  if (!isa_supported(which))
    throw std::invalid_argument(std::string("set_isa: this CPU cannot run the ") + isa_name(which) + " path (needs " + isa_requirement(which) + ")");
  g_isa.store(which, std::memory_order_relaxed);
}

isa requested_isa() { return g_isa.load(std::memory_order_relaxed); }

isa active_isa() {
  const isa which = g_isa.load(std::memory_order_relaxed);
  if (which != isa::best) return which;
  if (cpu_has_avx512()) return isa::avx512;
  return cpu_has_avx2() ? isa::avx2 : isa::scalar;
}

cpu_identity this_cpu() {
  cpu_identity id;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) == 0) return id;
  // The vendor string is ebx, edx, ecx: "AuthenticAMD".
  id.amd = ebx == 0x68747541u && edx == 0x69746e65u && ecx == 0x444d4163u;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return id;
  const unsigned base_family = eax >> 8 & 0xFu, base_model = eax >> 4 & 0xFu;
  id.family = base_family == 0xFu ? base_family + (eax >> 20 & 0xFFu) : base_family;
  id.model = base_family == 0xFu || base_family == 6u ? (eax >> 16 & 0xFu) << 4 | base_model : base_model;
  return id;
}

const char* isa_name(isa which) {
  switch (which) {
    case isa::scalar:
      return "scalar";
    case isa::avx2:
      return "avx2";
    case isa::avx512:
      return "avx512";
    case isa::best:
      return "best";
  }
  return "unknown";
}

}  // namespace tandem::kernels::cpu
