// Which instruction-set path the CPU kernels take. Every op with SIMD paths dispatches on
// active_isa() at call time; tests force a path to compare it against the scalar reference.
#pragma once

namespace tandem::kernels::cpu {

// scalar: plain C++, the reference every other path is tested against.
// avx2:   AVX2 + FMA + F16C.
// avx512: AVX-512 F/BW/VL/DQ + VNNI (vpdpbusd) on top of avx2; BF16 dot products also use
//         AVX-512 BF16 when the CPU has it (cpu_has_avx512_bf16), else their avx2 path.
// best:   the widest path the CPU supports, chosen at run time.
enum class isa { scalar, avx2, avx512, best };

// Whether this CPU can run the path (scalar and best: always).
bool isa_supported(isa which);
// The CPU features the path needs, for error messages ("AVX2, FMA and F16C").
const char* isa_requirement(isa which);
// Forces a path for every later kernel call in the process; `best` restores the automatic
// choice. Throws std::invalid_argument for a path the CPU cannot run.
void set_isa(isa which);
// The path kernels take now: scalar, avx2 or avx512, never best.
isa active_isa();
// What set_isa last asked for (best when nothing is forced): what to pass back to set_isa to
// undo a later call.
isa requested_isa();
const char* isa_name(isa which);
// AVX-512 BF16 (vdpbf16ps), used by the avx512 path for BF16 weights when present.
bool cpu_has_avx512_bf16();
// PREFETCHW (a request for a line with the right to write it; cpuid 0x80000001 ECX bit 8):
// matmul asks for a batch's output lines with it where present.
bool cpu_has_prefetchw();
// AVX-VNNI (vpdpbusd on ymm registers, without AVX-512), used by the avx2 path's packed
// kernels when present and allowed. set_avx_vnni(false) makes the avx2 path what CPUs without
// it get (`tandem bench --isa avx2`; --isa avxvnni allows it again); on by default.
bool cpu_has_avx_vnni();
void set_avx_vnni(bool allowed);
bool avx_vnni_allowed();
// cpu_has_avx_vnni() and allowed.
bool avx_vnni_active();
// AMX-INT8 (tile registers, tdpbsud) with AVX-512, and the operating system's leave to use
// it (Linux: arch_prctl(ARCH_REQ_XCOMP_PERM) for the tile data, asked once per process here):
// the avx512 path's products over expanded panels take it when present and allowed (Sapphire
// Rapids and later). set_amx(false) makes the avx512 path what AVX-512 CPUs without AMX get
// (`tandem bench --isa avx512`); on by default.
bool cpu_has_amx();
void set_amx(bool allowed);
bool amx_allowed();
// active_isa() is avx512, cpu_has_amx() and allowed.
bool amx_active();
// The path kernels take now, for reports: isa_name(active_isa()), "avxvnni" for the avx2
// path with AVX-VNNI active, "amx" for the avx512 path with AMX active.
const char* active_path_name();

// Who made the CPU and its x86 family and model as cpuid reports them (family: base plus
// extended, 0x17 for AMD Zen and Zen 2, 0x19 for Zen 3 and Zen 4; model: extended model
// above base model): what tunings measured on one microarchitecture key on (packed.h).
struct cpu_identity {
  bool amd = false;
  unsigned family = 0;
  unsigned model = 0;
};
cpu_identity this_cpu();

}  // namespace tandem::kernels::cpu
