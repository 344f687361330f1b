#include "bench/grammar_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>

#include "bench/chat_prompt.h"
#include "kernels/cpu/thread_pool.h"
#include "models/gguf_reader.h"
#include "models/model.h"
#include "models/tokenizer.h"
#include "runtime/engine.h"
#include "runtime/grammar_matcher.h"
#include "runtime/json_schema.h"

namespace tandem::bench {

namespace {

using clock_type = std::chrono::steady_clock;

constexpr const char* k_schema = R"({"type": "object", "properties": {
  "name": {"type": "string"}, "species": {"type": "string"}, "age": {"type": "integer"},
  "weight_kg": {"type": "number"}, "colors": {"type": "array", "items": {"enum": ["black", "white", "orange", "grey", "brown"]}, "maxItems": 3},
  "indoor": {"type": "boolean"}, "notes": {"type": "string"}},
  "required": ["name", "species", "age", "weight_kg", "colors", "indoor", "notes"]})";

constexpr const char* k_prompt =
    "Describe a pet cat as a JSON object with the fields name, species, age, weight_kg, colors (a list), indoor (true or false) and "
    "notes (one sentence). Answer with the JSON only.";

struct run_out {
  std::vector<int32_t> tokens;
  std::string text;
  double decode_s = 0;
};

run_out run_one(runtime::engine& eng, const runtime::engine_request& rq) {
  auto h = eng.submit(rq);
  run_out r;
  runtime::piece p;
  std::optional<clock_type::time_point> first;
  while (h->next(&p)) {
    r.text += p.text;
    if (p.token < 0) continue;
    r.tokens.push_back(p.token);
    if (!first) first = p.at;
  }
  if (h->finished() == runtime::finish_reason::error) throw std::runtime_error("bench grammar: the request failed: " + h->error());
  if (r.tokens.size() < 2) throw std::runtime_error("bench grammar: the model answered with " + std::to_string(r.tokens.size()) + " token(s)");
  r.decode_s = std::chrono::duration<double>(h->finished_at() - *first).count();
  return r;
}

double ms_per_token(const run_out& r) { return r.decode_s * 1e3 / static_cast<double>(r.tokens.size() - 1); }

// Mask and advance for each token of `ids`, from a fresh matcher; microseconds per token.
double replay_us(const std::shared_ptr<const runtime::grammar>& g, const std::shared_ptr<const runtime::grammar_vocab>& v,
                 const std::vector<int32_t>& ids, size_t vocab_rows, int64_t* states) {
  runtime::grammar_matcher m(g, v);
  std::vector<float> logits(vocab_rows, 0.5f);
  const auto t0 = clock_type::now();
  for (const int32_t id : ids) {
    m.mask(logits);
    if (!m.accept(id)) throw std::runtime_error("bench grammar: the replayed answer leaves the grammar at token " + std::to_string(id));
  }
  const double us = std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
  if (states) *states = static_cast<int64_t>(m.states());
  return ids.empty() ? 0.0 : us / static_cast<double>(ids.size());
}

// Uniform steps over the allowed tokens (a new document, from a fresh matcher, when one ends).
double random_us(const std::shared_ptr<const runtime::grammar>& g, const std::shared_ptr<const runtime::grammar_vocab>& v, int steps) {
  std::mt19937_64 rng(17);
  auto m = std::make_unique<runtime::grammar_matcher>(g, v);
  std::vector<float> logits(static_cast<size_t>(v->n_vocab()), 0.5f);
  std::vector<int32_t> ok;
  double us = 0;
  for (int s = 0; s < steps; ++s) {
    const auto t0 = clock_type::now();
    m->mask(logits);
    const auto& bits = m->allowed();
    const double t_mask = std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
    ok.clear();
    for (int32_t t = 0; t < v->n_vocab(); ++t)
      if ((bits[static_cast<size_t>(t) / 64] >> (t % 64)) & 1 && !v->pieces[static_cast<size_t>(t)].empty()) ok.push_back(t);
    if (ok.empty() || m->finished()) {
      m = std::make_unique<runtime::grammar_matcher>(g, v);
      us += t_mask;
      continue;
    }
    const int32_t pick = ok[rng() % ok.size()];
    const auto t1 = clock_type::now();
    m->accept(pick);
    us += t_mask + std::chrono::duration<double, std::micro>(clock_type::now() - t1).count();
  }
  return us / steps;
}

}  // namespace

grammar_bench_result run_grammar_bench(const grammar_bench_options& o) {
  if (o.gen < 2 || o.gen > models::k_max_context)
    throw std::invalid_argument("bench grammar: gen must be in [2, " + std::to_string(models::k_max_context) + "]");
  if (o.reps < 1 || o.reps > 1000) throw std::invalid_argument("bench grammar: reps must be in [1, 1000]");
  if (o.random_steps < 1 || o.random_steps > 1000000) throw std::invalid_argument("bench grammar: random_steps must be in [1, 1000000]");
  const models::model target(o.model_path);
  const auto tok = models::tokenizer::from_gguf(target.file());
  models::check_tokenizer_matches(tok, target.config(), o.model_path);
  const auto schema = nlohmann::ordered_json::parse(o.schema.empty() ? std::string(k_schema) : o.schema);
  const auto g = std::make_shared<const runtime::grammar>(runtime::parse_gbnf(runtime::json_schema_to_gbnf(schema)));
  const auto prompt = chat_prompt_tokens(target, tok, o.prompt.empty() ? std::string(k_prompt) : o.prompt, true);

  grammar_bench_result r;
  r.model_path = o.model_path;
  r.reps = o.reps;
  r.prompt_tokens = static_cast<int64_t>(prompt.size());
  const int64_t context = std::min<int64_t>(models::k_max_context, r.prompt_tokens + o.gen + 2);
  runtime::engine eng({{"target", &target, &tok, 0, 1, context}}, {.threads = o.threads});
  runtime::generation_params plain;
  plain.max_tokens = o.gen;
  plain.sampling.temperature = 0;
  plain.stop_at_eog = false;  // both sides decode comparable lengths
  runtime::generation_params constrained = plain;
  constrained.constraint = g;
  const runtime::engine_request free_rq{"target", prompt, plain}, json_rq{"target", prompt, constrained};
  const run_out answer = run_one(eng, json_rq);  // warm-up, and the answer replayed below
  (void)run_one(eng, free_rq);
  std::vector<double> plain_ms, json_ms, overhead;
  for (int rep = 0; rep < o.reps; ++rep) {
    std::optional<run_out> p, c;
    if (rep % 2 == 0) {
      p = run_one(eng, free_rq);
      c = run_one(eng, json_rq);
    } else {
      c = run_one(eng, json_rq);
      p = run_one(eng, free_rq);
    }
    plain_ms.push_back(ms_per_token(*p));
    json_ms.push_back(ms_per_token(*c));
    overhead.push_back((json_ms.back() / plain_ms.back() - 1) * 100);
  }
  r.threads = o.threads > 0 ? o.threads : kernels::cpu::default_thread_count();
  r.decode_ms_plain = summarize(plain_ms);
  r.decode_ms_constrained = summarize(json_ms);
  r.overhead_pct = summarize(overhead);
  r.generated = static_cast<int64_t>(answer.tokens.size());
  r.output = answer.text;
  r.valid = !nlohmann::json::parse(answer.text, nullptr, false).is_discarded();

  auto measure = [&](const std::string& path, const models::tokenizer& t, std::vector<int32_t> ids, size_t rows) {
    grammar_vocab_figures f;
    f.path = path;
    const auto v = runtime::make_grammar_vocab(t);
    f.n_vocab = v->n_vocab();
    f.replay_tokens = static_cast<int64_t>(ids.size());
    std::vector<double> us;
    for (int rep = 0; rep < std::max(o.reps, 3); ++rep) us.push_back(replay_us(g, v, ids, rows, &f.states));
    f.mask_us_per_token = summarize(us);
    f.random_us_per_token = random_us(g, v, o.random_steps);
    f.mask_pct_of_decode = f.mask_us_per_token.median / (r.decode_ms_plain.median * 1e3) * 100;
    r.vocabs.push_back(std::move(f));
  };
  measure(o.model_path, tok, answer.tokens, static_cast<size_t>(target.config().n_vocab));
  for (const auto& path : o.vocab_paths) {
    const models::gguf_file f(path);
    const auto t = models::tokenizer::from_gguf(f);
    measure(path, t, t.encode(answer.text, false, false), static_cast<size_t>(t.n_vocab()));
  }
  return r;
}

nlohmann::json to_json(const grammar_bench_result& r) {
  nlohmann::json j;
  j["model"] = std::filesystem::path(r.model_path).filename().string();
  j["threads"] = r.threads;
  j["reps"] = r.reps;
  j["prompt_tokens"] = r.prompt_tokens;
  j["generated"] = r.generated;
  j["output"] = r.output;
  j["valid_json"] = r.valid;
  auto put = [](nlohmann::json& into, const char* name, const summary& s) {
    into[name] = s.median;
    into[std::string(name) + "_min"] = s.min;
    into[std::string(name) + "_max"] = s.max;
  };
  put(j, "decode_ms_plain", r.decode_ms_plain);
  put(j, "decode_ms_constrained", r.decode_ms_constrained);
  put(j, "overhead_pct", r.overhead_pct);
  auto vocabs = nlohmann::json::array();
  for (const auto& v : r.vocabs) {
    nlohmann::json e{{"vocab", std::filesystem::path(v.path).filename().string()}, {"n_vocab", v.n_vocab}, {"replay_tokens", v.replay_tokens}};
    put(e, "mask_us_per_token", v.mask_us_per_token);
    e["mask_pct_of_decode"] = v.mask_pct_of_decode;
    e["random_us_per_token"] = v.random_us_per_token;
    e["states"] = v.states;
    vocabs.push_back(std::move(e));
  }
  j["vocabs"] = std::move(vocabs);
  if (!r.vocabs.empty()) {
    j["mask_us_per_token"] = r.vocabs[0].mask_us_per_token.median;
    j["mask_pct_of_decode"] = r.vocabs[0].mask_pct_of_decode;
  }
  return j;
}

std::string format_table(const grammar_bench_result& r) {
  std::string out;
  char line[512];
  auto add = [&](const char* fmt, auto... args) {
    std::snprintf(line, sizeof line, fmt, args...);
    out += line;
  };
  add("model: %s; prompt %lld tokens, %lld generated under the schema (greedy, %s); threads %d, %d reps: median [min .. max]\n", r.model_path.c_str(),
      static_cast<long long>(r.prompt_tokens), static_cast<long long>(r.generated), r.valid ? "valid JSON" : "NOT JSON", r.threads, r.reps);
  add("%-28s %10.3f ms   [%.3f .. %.3f]\n", "decode per token, free", r.decode_ms_plain.median, r.decode_ms_plain.min, r.decode_ms_plain.max);
  add("%-28s %10.3f ms   [%.3f .. %.3f]\n", "decode per token, schema", r.decode_ms_constrained.median, r.decode_ms_constrained.min,
      r.decode_ms_constrained.max);
  add("%-28s %10.2f %%    [%.2f .. %.2f]\n", "engine overhead", r.overhead_pct.median, r.overhead_pct.min, r.overhead_pct.max);
  add("%-34s %8s %10s %10s %10s %8s\n", "vocabulary", "n_vocab", "mask us", "% decode", "random us", "states");
  for (const auto& v : r.vocabs)
    add("%-34s %8d %10.1f %10.2f %10.1f %8lld\n", std::filesystem::path(v.path).filename().string().c_str(), v.n_vocab, v.mask_us_per_token.median,
        v.mask_pct_of_decode, v.random_us_per_token, static_cast<long long>(v.states));
  return out;
}

}  // namespace tandem::bench
