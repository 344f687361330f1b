#include "models/synth.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <numbers>
#include <stdexcept>
#include <thread>

#include "kernels/cpu/quants.h"
#include "models/gguf_reader.h"
#include "models/gguf_writer.h"

namespace tandem::models {
namespace {

using kernels::weight_type;

// Our own generator, so the weights depend on nothing but the seed (std::normal_distribution
// differs between standard libraries).
struct splitmix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

uint64_t hash_name(std::string_view s) {  // FNV-1a
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return h;
}

// n samples of mean + stddev * N(0, 1) by Box-Muller, two per pair of uniforms.
void fill_normal(uint64_t seed, float mean, float stddev, float* out, int64_t n) {
  splitmix64 rng{seed};
  constexpr double k_2_53 = 1.0 / 9007199254740992.0;
  for (int64_t i = 0; i < n; i += 2) {
    const double u1 = static_cast<double>((rng.next() >> 11) + 1) * k_2_53;  // (0, 1]: log is finite
    const double u2 = static_cast<double>(rng.next() >> 11) * k_2_53;
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double a = 2.0 * std::numbers::pi * u2;
    out[i] = static_cast<float>(mean + stddev * r * std::cos(a));
    if (i + 1 < n) out[i + 1] = static_cast<float>(mean + stddev * r * std::sin(a));
  }
}

// How one tensor is initialised.
struct tensor_plan {
  std::string name;
  std::vector<int64_t> ne;
  weight_type type;
  float mean;
  float stddev;
};

// llama.cpp's llama_ftype numbering for general.file_type (the "mostly" type).
uint32_t file_type_of(weight_type t) {
  switch (t) {
    case weight_type::f32:
      return 0;
    case weight_type::f16:
      return 1;
    case weight_type::q4_0:
      return 2;
    case weight_type::q4_1:
      return 3;
    case weight_type::q8_0:
      return 7;
    case weight_type::q5_0:
      return 8;
    case weight_type::q5_1:
      return 9;
    case weight_type::q4_k:
      return 14;  // Q4_K_S: every matrix Q4_K
    case weight_type::q5_k:
      return 16;  // Q5_K_S
    case weight_type::q6_k:
      return 18;
    case weight_type::bf16:
      return 32;
    default:
      return 0;
  }
}

void require_positive(int64_t v, const char* option) {
  if (v <= 0) throw std::invalid_argument(std::string("synth: --") + option + " must be positive (got " + std::to_string(v) + ")");
}

// Generates rows [begin, end) of a tensor into `out` (the whole tensor's bytes).
void fill_rows(const tensor_plan& p, uint64_t tensor_seed, int64_t begin, int64_t end, std::span<std::byte> out) {
  const int64_t row = p.ne[0];
  const int64_t row_bytes = kernels::row_bytes(p.type, row);
  std::vector<float> buf(static_cast<size_t>(row));
  for (int64_t r = begin; r < end; ++r) {
    // Each row has its own seed, so rows can be made in any order or in parallel.
    fill_normal(tensor_seed + static_cast<uint64_t>(r) * 0xd1b54a32d192ed03ull, p.mean, p.stddev, buf.data(), row);
    kernels::cpu::quantize_row(p.type, buf.data(), out.data() + r * row_bytes, row);
  }
}

void fill_tensor(const tensor_plan& p, uint64_t seed, int max_threads, std::span<std::byte> out) {
  const uint64_t tensor_seed = splitmix64{seed ^ hash_name(p.name)}.next();
  int64_t rows = 1;
  for (size_t d = 1; d < p.ne.size(); ++d) rows *= p.ne[d];
  const int64_t elems = rows * p.ne[0];
  // Large tensors (a million elements per thread at least) are split over threads by rows;
  // the bytes do not depend on the split.
  const int64_t cores = max_threads > 0 ? max_threads : std::min<int64_t>(std::thread::hardware_concurrency(), elems / (1 << 20));
  const int64_t threads = std::clamp<int64_t>(std::min(cores, rows), 1, 64);
  if (threads == 1) return fill_rows(p, tensor_seed, 0, rows, out);
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  for (int64_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      try {
        fill_rows(p, tensor_seed, rows * t / threads, rows * (t + 1) / threads, out);
      } catch (...) {
        errors[static_cast<size_t>(t)] = std::current_exception();
      }
    });
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace

bool synth_supports(weight_type t) {
  switch (t) {
    case weight_type::f32:
    case weight_type::f16:
    case weight_type::bf16:
    case weight_type::q4_0:
    case weight_type::q4_1:
    case weight_type::q5_0:
    case weight_type::q5_1:
    case weight_type::q8_0:
    case weight_type::q4_k:
    case weight_type::q5_k:
    case weight_type::q6_k:
      return true;
    default:
      return false;
  }
}

synth_report synth_model(const synth_options& opt, const std::string& out_path) {
  const auto start = std::chrono::steady_clock::now();
  const std::string& arch = opt.arch;
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3")
    throw std::invalid_argument("synth: --arch '" + arch + "' is not one of llama, qwen2, qwen3");
  require_positive(opt.dim, "dim");
  require_positive(opt.layers, "layers");
  require_positive(opt.heads, "heads");
  require_positive(opt.ffn, "ffn");
  require_positive(opt.context, "context");
  const int64_t kv_heads = opt.kv_heads == 0 ? opt.heads : opt.kv_heads;
  require_positive(kv_heads, "kv-heads");
  if (opt.heads % kv_heads != 0)
    throw std::invalid_argument("synth: --heads " + std::to_string(opt.heads) + " is not a multiple of --kv-heads " + std::to_string(kv_heads));
  int64_t head_dim = opt.head_dim;
  if (head_dim == 0) {
    if (opt.dim % opt.heads != 0)
      throw std::invalid_argument("synth: --dim " + std::to_string(opt.dim) + " is not a multiple of --heads " + std::to_string(opt.heads) +
                                  " (give --head-dim)");
    head_dim = opt.dim / opt.heads;
  }
  require_positive(head_dim, "head-dim");
  if (head_dim % 2 != 0) throw std::invalid_argument("synth: --head-dim " + std::to_string(head_dim) + " must be even (RoPE rotates pairs)");
  // llama.cpp's qwen2 graph sizes Q as {D, D}; only llama and qwen3 read key_length.
  if (arch == "qwen2" && head_dim * opt.heads != opt.dim) throw std::invalid_argument("synth: qwen2 needs --head-dim = --dim / --heads");
  if (!synth_supports(opt.type))
    throw std::invalid_argument("synth: --type " + kernels::display_name(opt.type) +
                                " cannot be written (use F32, F16, BF16, "
                                "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K or Q6_K)");

  const gguf_file vocab(opt.vocab_path);
  const auto tokens = vocab.find("tokenizer.ggml.tokens");
  if (!tokens || tokens->type != gguf_type::array || tokens->elem_type != gguf_type::string || tokens->count == 0)
    throw gguf_error(vocab.path() + ": key 'tokenizer.ggml.tokens': missing or not a non-empty array of strings");
  const auto n_vocab = static_cast<int64_t>(tokens->count);

  gguf_writer w;
  w.set("general.architecture", gguf_out_value::string(arch));
  w.set("general.name", gguf_out_value::string(opt.name.empty() ? "synth-" + arch : opt.name));
  w.set("general.file_type", gguf_out_value::u32(file_type_of(opt.type)));
  w.set("general.quantization_version", gguf_out_value::u32(2));
  const bool qwen = arch != "llama";
  auto u32 = [](int64_t v) { return gguf_out_value::u32(static_cast<uint32_t>(v)); };
  w.set(arch + ".vocab_size", u32(n_vocab));
  w.set(arch + ".context_length", u32(opt.context));
  w.set(arch + ".embedding_length", u32(opt.dim));
  w.set(arch + ".block_count", u32(opt.layers));
  w.set(arch + ".feed_forward_length", u32(opt.ffn));
  w.set(arch + ".attention.head_count", u32(opt.heads));
  w.set(arch + ".attention.head_count_kv", u32(kv_heads));
  w.set(arch + ".attention.layer_norm_rms_epsilon", gguf_out_value::f32(qwen ? 1e-6f : 1e-5f));
  w.set(arch + ".rope.freq_base", gguf_out_value::f32(qwen ? 1e6f : 1e4f));
  w.set(arch + ".rope.dimension_count", u32(head_dim));
  if (head_dim * opt.heads != opt.dim) {
    w.set(arch + ".attention.key_length", u32(head_dim));
    w.set(arch + ".attention.value_length", u32(head_dim));
  }
  for (const auto& kv : vocab.metadata())
    if (kv.key.starts_with("tokenizer.")) w.set(kv.key, gguf_out_value::from(kv.value));

  // Shapes in ggml order (ne[0] = input dim). Scales keep activations near unit size:
  // projections N(0, 0.02), the two residual outputs shrunk by sqrt(2L) as in GPT-2, norm
  // weights 1 + N(0, 0.02).
  const float k_std = 0.02f;
  const float out_std = k_std / std::sqrt(2.0f * static_cast<float>(opt.layers));
  const int64_t q_dim = opt.heads * head_dim, kv_dim = kv_heads * head_dim;
  std::vector<tensor_plan> plan;
  auto matrix = [&](std::string name, int64_t in, int64_t out, float stddev) {
    plan.push_back({std::move(name), {in, out}, opt.type, 0.0f, stddev});
  };
  auto vector = [&](std::string name, int64_t n, float mean) { plan.push_back({std::move(name), {n}, weight_type::f32, mean, k_std}); };
  matrix("token_embd.weight", opt.dim, n_vocab, k_std);
  for (int64_t l = 0; l < opt.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    vector(b + "attn_norm.weight", opt.dim, 1.0f);
    matrix(b + "attn_q.weight", opt.dim, q_dim, k_std);
    matrix(b + "attn_k.weight", opt.dim, kv_dim, k_std);
    matrix(b + "attn_v.weight", opt.dim, kv_dim, k_std);
    if (arch == "qwen2") {
      vector(b + "attn_q.bias", q_dim, 0.0f);
      vector(b + "attn_k.bias", kv_dim, 0.0f);
      vector(b + "attn_v.bias", kv_dim, 0.0f);
    }
    if (arch == "qwen3") {
      vector(b + "attn_q_norm.weight", head_dim, 1.0f);
      vector(b + "attn_k_norm.weight", head_dim, 1.0f);
    }
    matrix(b + "attn_output.weight", q_dim, opt.dim, out_std);
    vector(b + "ffn_norm.weight", opt.dim, 1.0f);
    matrix(b + "ffn_gate.weight", opt.dim, opt.ffn, k_std);
    matrix(b + "ffn_up.weight", opt.dim, opt.ffn, k_std);
    matrix(b + "ffn_down.weight", opt.ffn, opt.dim, out_std);
  }
  vector("output_norm.weight", opt.dim, 1.0f);
  if (!opt.tied) matrix("output.weight", opt.dim, n_vocab, k_std);

  synth_report report;
  const int64_t block = kernels::info(opt.type).block_elems;
  for (auto& p : plan) {
    if (p.ne.size() != 2 || p.ne[0] % block == 0) continue;
    const auto fallback = p.ne[0] % 32 == 0 ? weight_type::q8_0 : weight_type::f16;
    // One note per tensor kind, not per layer.
    std::string kind = p.name;
    if (kind.starts_with("blk.")) kind = "blk.*." + kind.substr(kind.find('.', 4) + 1);
    std::string note = kind + ": ne[0] = " + std::to_string(p.ne[0]) + " is not a multiple of the " + kernels::display_name(opt.type) +
                       " block size " + std::to_string(block) + ", written as " + kernels::display_name(fallback);
    if (std::find(report.notes.begin(), report.notes.end(), note) == report.notes.end()) report.notes.push_back(std::move(note));
    p.type = fallback;
  }

  for (const auto& p : plan) {
    int64_t elems = 1;
    for (auto d : p.ne) elems *= d;
    report.parameters += elems;
    w.add_tensor(p.name, p.ne, p.type, [p, seed = opt.seed, threads = opt.threads](std::span<std::byte> out) { fill_tensor(p, seed, threads, out); });
  }
  report.bytes = w.layout().file_size;
  w.write(out_path);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace tandem::models
