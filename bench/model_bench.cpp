#include "bench/model_bench.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>

#include "kernels/cpu/act_quant.h"
#include "models/forward.h"

namespace tandem::bench {
namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

// SplitMix64: a fixed, portable sequence (std::uniform_int_distribution differs between
// standard libraries).
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void check_params(const model_bench_params& p) {
  if (p.prompt < 1 || p.prompt > models::k_max_context)
    throw std::invalid_argument("bench: prompt must be in [1, " + std::to_string(models::k_max_context) + "], got " + std::to_string(p.prompt));
  if (p.gen < 1 || p.gen > models::k_max_context)
    throw std::invalid_argument("bench: gen must be in [1, " + std::to_string(models::k_max_context) + "], got " + std::to_string(p.gen));
  if (p.batch < 1 || p.batch > models::k_max_sequences)
    throw std::invalid_argument("bench: batch must be in [1, " + std::to_string(models::k_max_sequences) + "], got " + std::to_string(p.batch));
  if (p.reps < 1) throw std::invalid_argument("bench: reps must be at least 1, got " + std::to_string(p.reps));
  if (p.decode_pause_every < 0)
    throw std::invalid_argument("bench: decode_pause_every must be at least 0, got " + std::to_string(p.decode_pause_every));
  if (p.depth < 0 || p.depth > models::k_max_context - std::max(p.prompt, p.gen))
    throw std::invalid_argument("bench: depth must be in [0, " + std::to_string(models::k_max_context - std::max(p.prompt, p.gen)) +
                                "] (the context holds depth + max(prompt, gen) tokens), got " + std::to_string(p.depth));
  if (p.compare_prompt && !p.fast_prompt_attention)
    throw std::invalid_argument(
        "bench: compare_prompt measures llama.cpp's prefill beside the server's; "
        "without fast_prompt_attention both would be llama.cpp's");
}

// The matrices a decode step multiplies by: the output head and every layer's projections.
template <class F>
void for_each_matrix(const models::model& m, F&& f) {
  const auto& w = m.weights();
  f(w.output);
  for (const auto& L : w.layers)
    for (const models::weight_view* v : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) f(*v);
}

}  // namespace

std::vector<int32_t> bench_tokens(int64_t n_vocab, int64_t n, uint64_t seed) {
  if (n_vocab < 1) throw std::invalid_argument("bench_tokens: n_vocab must be positive");
  std::vector<int32_t> ids(static_cast<size_t>(std::max<int64_t>(n, 0)));
  uint64_t state = seed;
  for (auto& id : ids) id = static_cast<int32_t>(splitmix64(state) % static_cast<uint64_t>(n_vocab));
  return ids;
}

uint64_t decode_weight_bytes(const models::model& m) {
  uint64_t bytes = 0;
  for (const auto& t : m.file().tensors())
    if (t.name != "token_embd.weight") bytes += t.bytes;
  const auto& embd = m.file().tensor("token_embd.weight");
  bytes += embd.bytes / static_cast<uint64_t>(std::max<int64_t>(embd.rows(), 1));
  // Tied: the output head multiplies by the whole embedding table every step.
  if (m.config().tied_embeddings) bytes += embd.bytes;
  // Matrices packed at load are read as packed (Q4_K's panels are larger; the last panel of a
  // matrix is padded to 16 rows).
  auto packed_extra = [](const models::weight_view& v) -> int64_t {
    if (v.layout != kernels::cpu::weight_layout::packed) return 0;
    return static_cast<int64_t>(kernels::cpu::packed_bytes(v.type, v.rows, v.cols)) - v.rows * kernels::row_bytes(v.type, v.cols);
  };
  int64_t extra = 0;
  for_each_matrix(m, [&](const models::weight_view& v) { extra += packed_extra(v); });
  return bytes + static_cast<uint64_t>(extra);
}

uint64_t decode_int8_macs(const models::model& m) {
  auto int8 = [](const models::weight_view& v) -> uint64_t {
    const auto act = kernels::cpu::activation_type(v.type);
    const bool dots = act == kernels::weight_type::q8_0 || act == kernels::weight_type::q8_1 || act == kernels::weight_type::q8_k;
    return dots ? static_cast<uint64_t>(v.rows) * static_cast<uint64_t>(v.cols) : 0;
  };
  uint64_t macs = 0;
  for_each_matrix(m, [&](const models::weight_view& v) { macs += int8(v); });
  return macs;
}

kernels::weight_type main_weight_type(const models::model& m) {
  std::map<kernels::weight_type, uint64_t> by_type;
  for (const auto& t : m.file().tensors()) by_type[t.type] += t.bytes;
  return std::max_element(by_type.begin(), by_type.end(), [](const auto& a, const auto& b) { return a.second < b.second; })->first;
}

model_bench_result run_model_bench(const models::model& m, kernels::cpu::thread_pool& pool, const model_bench_params& p,
                                   const std::function<void()>& after_decode_rep, const std::function<void()>& during_decode) {
  check_params(p);
  const auto& cfg = m.config();
  // One id stream: prompt, then the decode tokens, then one token per sequence per batched
  // pass, then the fill before each timed phase (--depth).
  const auto ids = bench_tokens(cfg.n_vocab, p.prompt + p.gen + p.batch * p.gen + p.depth, p.seed);
  const int32_t* prompt_ids = ids.data();
  const int32_t* gen_ids = prompt_ids + p.prompt;
  const int32_t* batch_ids = gen_ids + p.gen;
  const int32_t* depth_ids = batch_ids + p.batch * p.gen;

  model_bench_result r;
  r.decode_bytes_per_token = decode_weight_bytes(m);
  r.int8_macs_per_token = decode_int8_macs(m);
  {
    models::context_params cp;
    cp.n_ctx = p.depth + std::max(p.prompt, p.gen);
    // llama-bench's default micro-batch: a 512-token prompt is one forward pass (and so is
    // each 512 tokens of the fill, whatever the prompt's length).
    cp.max_batch = std::min<int64_t>(std::max(p.prompt, p.depth), 512);
    // With the comparison, the main context decodes with a pool job per step and the second
    // one with layer teams (the default otherwise).
    if (p.compare_layer_teams) cp.layer_teams = false;
    models::forward_context ctx(m, cp, &pool);
    std::optional<models::forward_context> teams;
    if (p.compare_layer_teams) {
      models::context_params tp = cp;
      tp.layer_teams = true;
      teams.emplace(m, tp, &pool);
    }

    // Warm-up: faults in every weight page and wakes the pool.
    ctx.eval({prompt_ids, static_cast<size_t>(std::min<int64_t>(p.prompt, 16))});
    ctx.reset();
    ctx.eval({gen_ids, 1});
    ctx.reset();
    if (teams) {
      teams->eval({gen_ids, 1});
      teams->reset();
    }

    // The cache as a phase starts: `depth` tokens, computed as the server computes prompts
    // (untimed, so the faster arithmetic only shortens the run); positions from depth on
    // take the arithmetic of the phase (`timed_fast_end`).
    auto fill_context = [&](models::forward_context& c, int64_t timed_fast_end) {
      c.reset();
      c.set_prompt_end(0, p.depth + timed_fast_end);
      if (p.depth > 0) c.eval({depth_ids, static_cast<size_t>(p.depth)});
      if (timed_fast_end == 0) c.set_prompt_end(0, 0);
    };
    auto fill = [&](int64_t timed_fast_end) { fill_context(ctx, timed_fast_end); };
    // gen one-token passes from the filled cache, in tokens per second.
    // With `pauses`, the clock stops every decode_pause_every tokens for during_decode.
    auto decode_rate = [&](models::forward_context& c, bool pauses) {
      fill_context(c, p.fast_decode_attention ? p.gen : 0);
      r.decode_start_position = c.pos();
      const int64_t every = pauses && during_decode ? p.decode_pause_every : 0;
      double seconds = 0;
      auto t0 = clock_type::now();
      for (int64_t i = 0; i < p.gen; ++i) {
        c.eval({gen_ids + i, 1});
        if (every > 0 && (i + 1) % every == 0 && i + 1 < p.gen) {
          seconds += seconds_since(t0);
          during_decode();
          t0 = clock_type::now();
        }
      }
      seconds += seconds_since(t0);
      const double tok_s = static_cast<double>(p.gen) / seconds;
      c.reset();
      return tok_s;
    };
    // One timed prefill of the prompt by the server's arithmetic (fast) or llama.cpp's.
    auto prefill_rate = [&](bool fast) {
      fill(fast ? p.prompt : 0);
      r.prefill_start_position = ctx.pos();
      const auto t0 = clock_type::now();
      ctx.eval({prompt_ids, static_cast<size_t>(p.prompt)});
      return static_cast<double>(p.prompt) / seconds_since(t0);
    };
    for (int rep = 0; rep < p.reps; ++rep) {
      if (p.compare_prompt && rep % 2 == 1) r.prefill_exact_tok_s.push_back(prefill_rate(false));
      r.prefill_tok_s.push_back(prefill_rate(p.fast_prompt_attention));
      if (p.compare_prompt && rep % 2 == 0) r.prefill_exact_tok_s.push_back(prefill_rate(false));
    }
    // As llama-bench's tg test: from an empty cache (or one `depth` tokens deep, as its -d),
    // one token per pass, no sampling.
    for (int rep = 0; rep < p.reps; ++rep) {
      // With the comparison, every other repetition decodes with layer teams first, so a slow
      // spell of a shared machine weighs on both sides of the ratio.
      if (teams && rep % 2 == 1) r.decode_layer_teams_tok_s.push_back(decode_rate(*teams, false));
      const double tok_s = decode_rate(ctx, true);
      r.decode_tok_s.push_back(tok_s);
      r.decode_gb_s.push_back(static_cast<double>(r.decode_bytes_per_token) * tok_s / 1e9);
      if (after_decode_rep) after_decode_rep();
      if (teams && rep % 2 == 0) r.decode_layer_teams_tok_s.push_back(decode_rate(*teams, false));
    }
  }  // the one-sequence context is freed before the batched one is made
  {
    models::context_params cp;
    cp.n_ctx = p.depth + p.gen;
    cp.n_seq = p.batch;
    cp.max_batch = std::max<int64_t>(p.batch, std::min<int64_t>(p.depth, 512));
    models::forward_context ctx(m, cp, &pool);
    std::vector<int64_t> seqs(static_cast<size_t>(p.batch));
    std::iota(seqs.begin(), seqs.end(), int64_t{0});
    // Sequences [0, n) emptied, then (untimed) `depth` tokens deep, as the single-sequence
    // phases start: the fill by the server's arithmetic, the timed rows by the batch's.
    auto reset_fill = [&](int64_t n) {
      for (int64_t s = 0; s < p.batch; ++s) ctx.reset(s);  // also clears the prompt end
      for (int64_t s = 0; s < n; ++s) {
        ctx.set_prompt_end(s, p.fast_batched_attention ? std::numeric_limits<int64_t>::max() : p.depth);
        if (p.depth > 0) ctx.eval({depth_ids, static_cast<size_t>(p.depth)}, false, s);
      }
    };
    reset_fill(p.batch);
    ctx.decode({batch_ids, seqs.size()}, seqs);  // warm-up
    // Batched passes and one sequence alone, alternating by repetition so that a slow spell
    // of a shared machine weighs on both sides of their ratio.
    const int64_t seq0 = 0;
    for (int rep = 0; rep < p.reps; ++rep) {
      reset_fill(p.batch);
      if (rep == 0) {
        r.batched_start_position = ctx.pos(0);
        for (int64_t s = 1; s < p.batch; ++s) r.batched_start_position = std::min(r.batched_start_position, ctx.pos(s));
      }
      auto t0 = clock_type::now();
      for (int64_t i = 0; i < p.gen; ++i) ctx.decode({batch_ids + i * p.batch, seqs.size()}, seqs);
      r.batched_decode_tok_s.push_back(static_cast<double>(p.batch * p.gen) / seconds_since(t0));
      reset_fill(1);
      t0 = clock_type::now();
      for (int64_t i = 0; i < p.gen; ++i) ctx.decode({batch_ids + i * p.batch, 1}, {&seq0, 1});
      r.decode_as_batched_tok_s.push_back(static_cast<double>(p.gen) / seconds_since(t0));
    }
  }
  r.prefill = summarize(r.prefill_tok_s);
  r.decode = summarize(r.decode_tok_s);
  r.batched_decode = summarize(r.batched_decode_tok_s);
  r.decode_as_batched = summarize(r.decode_as_batched_tok_s);
  r.decode_gb = summarize(r.decode_gb_s);
  if (!r.decode_layer_teams_tok_s.empty()) r.decode_layer_teams = summarize(r.decode_layer_teams_tok_s);
  if (!r.prefill_exact_tok_s.empty()) r.prefill_exact = summarize(r.prefill_exact_tok_s);
  return r;
}

}  // namespace tandem::bench
