#include "bench/spec_bench.h"

#include "bench/chat_prompt.h"
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "models/chat_template.h"
#include "models/forward.h"
#include "models/model.h"
#include "models/tokenizer.h"
#include "runtime/draft_mirror.h"
#include "runtime/engine.h"

namespace tandem::bench {

namespace {

// The code both built-in requests hand the model.
constexpr const char* k_stack_code = R"(```python
class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from an empty stack")
        return self.items.pop()

    def peek(self):
        if not self.items:
            raise IndexError("peek at an empty stack")
        return self.items[-1]

    def is_empty(self):
        return not self.items

    def size(self):
        return len(self.items)

    def clear(self):
        self.items = []
```)";

// A code-editing request whose answer repeats the code it gives (OpenAI's use of predicted
// outputs), and a code-generation request whose answer repeats the given code's identifiers
// and shape (what n-gram lookup finds).
std::string default_prompt(spec_bench_method m) {
  return std::string(m == spec_bench_method::prediction ? "Rewrite this code with the method size renamed to length."
                                                        : "Write a Queue class in the same style as this Stack class.") +
         "\n\n" + k_stack_code;
}

// The first ``` fenced block of `text`, fences included (answers are fenced too); "" if none.
std::string first_fenced_block(const std::string& text) {
  const auto open = text.find("```");
  if (open == std::string::npos) return {};
  const auto close = text.find("```", text.find('\n', open));
  if (close == std::string::npos) return {};
  return text.substr(open, close + 3 - open);
}

struct run_out {
  std::vector<int32_t> tokens;
  double decode_s = 0;
};

run_out run_one(runtime::engine& eng, const runtime::engine_request& rq) {
  auto h = eng.submit(rq);
  run_out r;
  runtime::piece p;
  std::optional<std::chrono::steady_clock::time_point> first;
  while (h->next(&p)) {
    if (p.token < 0) continue;
    r.tokens.push_back(p.token);
    if (!first) first = p.at;
  }
  if (h->finished() == runtime::finish_reason::error) throw std::runtime_error("bench spec: the request failed: " + h->error());
  if (r.tokens.size() < 2)
    throw std::runtime_error("bench spec: the model ended its answer after " + std::to_string(r.tokens.size()) +
                             " token(s); give a prompt it answers at length");
  r.decode_s = std::chrono::duration<double>(h->finished_at() - *first).count();
  return r;
}

double tok_s(const run_out& r) { return r.decode_s > 0 ? static_cast<double>(r.tokens.size() - 1) / r.decode_s : 0.0; }

}  // namespace

const char* spec_bench_method_name(spec_bench_method m) {
  switch (m) {
    case spec_bench_method::draft:
      return "draft";
    case spec_bench_method::ngram:
      return "ngram";
    case spec_bench_method::prediction:
      return "prediction";
  }
  return "?";
}

spec_bench_result run_spec_bench(const spec_bench_options& o) {
  if (o.gen < 2 || o.gen > models::k_max_context)
    throw std::invalid_argument("bench spec: gen must be in [2, " + std::to_string(models::k_max_context) + "]");
  if (o.reps < 1 || o.reps > 1000) throw std::invalid_argument("bench spec: reps must be in [1, 1000]");
  if (o.max_draft < 1 || o.max_draft > 32) throw std::invalid_argument("bench spec: max_draft must be in [1, 32]");
  if ((o.method == spec_bench_method::draft) == o.draft_path.empty())
    throw std::invalid_argument(o.method == spec_bench_method::draft ? "bench spec: the draft method needs a draft model file"
                                                                     : "bench spec: a draft model file is for the draft method only");
  const models::model target(o.model_path);
  const auto tok = models::tokenizer::from_gguf(target.file());
  models::check_tokenizer_matches(tok, target.config(), o.model_path);
  std::unique_ptr<models::model> draft;
  std::optional<models::tokenizer> draft_tok;
  if (!o.draft_path.empty()) {
    draft = std::make_unique<models::model>(o.draft_path);
    draft_tok = models::tokenizer::from_gguf(draft->file());
    models::check_tokenizer_matches(*draft_tok, draft->config(), o.draft_path);
  }

  const std::string text = !o.prompt.empty() ? o.prompt : default_prompt(o.method);
  const auto prompt = chat_prompt_tokens(target, tok, text, o.chat);
  std::vector<int32_t> prediction;
  if (o.method == spec_bench_method::prediction) {
    const std::string predicted = !o.prediction.empty() ? o.prediction : first_fenced_block(text);
    if (predicted.empty()) throw std::invalid_argument("bench spec: --prediction needs a predicted output, or a ``` fenced block in the prompt");
    prediction = tok.encode(predicted, false, false);  // as the API tokenizes `prediction.content`
  }

  spec_bench_result r;
  r.model_path = o.model_path;
  r.draft_path = o.draft_path;
  r.method = spec_bench_method_name(o.method);
  r.cost_aware = o.cost_aware;
  r.prompt_tokens = static_cast<int64_t>(prompt.size());
  r.prediction_tokens = static_cast<int64_t>(prediction.size());
  r.reps = o.reps;
  r.same_vocabulary = !draft_tok || runtime::same_vocabulary(tok, *draft_tok);

  // One sequence, the whole answer in its context; the plain runs turn speculation off per
  // request, so both sides run in the same engine, model and KV pool.
  const int64_t context = std::min<int64_t>(models::k_max_context, r.prompt_tokens + o.gen + o.max_draft + 2);
  std::vector<runtime::engine_model> models;
  runtime::engine_model em{"target", &target, &tok, 0, 1, context};
  em.speculate.max_tokens = o.max_draft;
  if (o.method == spec_bench_method::ngram) em.speculate.method = runtime::spec_method::ngram;
  if (draft) {
    em.speculate.method = runtime::spec_method::draft;
    em.draft = "draft";
    // Another vocabulary may spell the same text in several times the tokens.
    const int64_t draft_context = std::min<int64_t>(models::k_max_context, r.same_vocabulary ? context : 4 * context);
    models.push_back(em);
    models.push_back({"draft", draft.get(), &*draft_tok, 0, 1, draft_context});
  } else {
    models.push_back(em);
  }
  runtime::engine_config ec;
  ec.threads = o.threads;
  ec.max_batch_tokens = 256;
  ec.prefill_chunk = 256;
  ec.prefix_cache = false;  // each run computes its prompt (outside the decode figure anyway)
  ec.spec_cost_aware = o.cost_aware;
  runtime::engine eng(std::move(models), ec);

  runtime::engine_request plain{"target", prompt, {}};
  plain.params.max_tokens = o.gen;
  plain.params.sampling.temperature = 0;
  plain.params.speculate = false;
  runtime::engine_request spec = plain;
  spec.params.speculate = true;
  spec.params.prediction = prediction;

  // Warm-up: one of each, untimed (first touches of the weights and the KV pool).
  const auto want = run_one(eng, plain).tokens;
  r.identical = run_one(eng, spec).tokens == want;
  r.generated = static_cast<int64_t>(want.size());
  r.output = tok.decode(want);

  std::vector<double> plain_s, spec_s, ratio_s;
  int64_t proposed = 0, accepted = 0, spec_passes = 0, spec_pass_tokens = 0, decoded = 0;
  double draft_seconds = 0;
  for (int rep = 0; rep < o.reps; ++rep) {
    const bool spec_first = rep % 2 == 1;
    std::optional<run_out> p, s;
    for (int side = 0; side < 2; ++side) {
      if ((side == 0) != spec_first) {
        p = run_one(eng, plain);
        continue;
      }
      const auto before = eng.stats("target");
      s = run_one(eng, spec);
      const auto after = eng.stats("target");
      proposed += after.spec_proposed - before.spec_proposed;
      accepted += after.spec_accepted - before.spec_accepted;
      spec_passes += after.spec_passes - before.spec_passes;
      spec_pass_tokens += after.spec_tokens - before.spec_tokens;
      draft_seconds += after.draft_seconds - before.draft_seconds;
      decoded += static_cast<int64_t>(s->tokens.size()) - 1;
    }
    r.identical = r.identical && p->tokens == want && s->tokens == want;
    plain_s.push_back(tok_s(*p));
    spec_s.push_back(tok_s(*s));
    ratio_s.push_back(plain_s.back() > 0 ? spec_s.back() / plain_s.back() : 0.0);
  }
  r.threads = o.threads > 0 ? o.threads : kernels::cpu::default_thread_count();
  r.decode_tok_s_plain = summarize(plain_s);
  r.decode_tok_s_spec = summarize(spec_s);
  r.speedup = summarize(ratio_s);
  r.proposed = proposed;
  r.accepted = accepted;
  r.acceptance_rate = proposed > 0 ? static_cast<double>(accepted) / static_cast<double>(proposed) : 0.0;
  // Passes that verified proposals, plus one pass for each decoded token no proposal covered.
  const int64_t passes = std::max<int64_t>(1, spec_passes + std::max<int64_t>(0, decoded - spec_pass_tokens));
  r.tokens_per_pass = static_cast<double>(decoded) / static_cast<double>(passes);
  r.draft_ms_per_token = decoded > 0 ? draft_seconds * 1e3 / static_cast<double>(decoded) : 0.0;
  return r;
}

nlohmann::json to_json(const spec_bench_result& r) {
  nlohmann::json j;
  j["model"] = std::filesystem::path(r.model_path).filename().string();
  j["method"] = r.method;
  if (!r.draft_path.empty()) {
    j["draft"] = std::filesystem::path(r.draft_path).filename().string();
    j["same_vocabulary"] = r.same_vocabulary;
    j["cost_aware"] = r.cost_aware;
  }
  j["prompt_tokens"] = r.prompt_tokens;
  if (r.method == "prediction") j["prediction_tokens"] = r.prediction_tokens;
  j["generated"] = r.generated;
  j["output"] = r.output;
  j["threads"] = r.threads;
  j["reps"] = r.reps;
  auto put = [&](const char* name, const summary& s) {
    j[name] = s.median;
    j[std::string(name) + "_min"] = s.min;
    j[std::string(name) + "_max"] = s.max;
  };
  put("decode_tok_s_plain", r.decode_tok_s_plain);
  put("decode_tok_s_spec", r.decode_tok_s_spec);
  put("speedup", r.speedup);
  j["proposed"] = r.proposed;
  j["accepted"] = r.accepted;
  j["acceptance_rate"] = r.acceptance_rate;
  j["tokens_per_pass"] = r.tokens_per_pass;
  j["draft_ms_per_token"] = r.draft_ms_per_token;
  j["identical"] = r.identical;
  return j;
}

std::string format_table(const spec_bench_result& r) {
  std::string out;
  char line[512];
  auto add = [&](const char* fmt, auto... args) {
    std::snprintf(line, sizeof line, fmt, args...);
    out += line;
  };
  add("model: %s, speculation by %s", r.model_path.c_str(), r.method.c_str());
  if (!r.draft_path.empty())
    add(" %s (%s vocabulary; %s)", r.draft_path.c_str(), r.same_vocabulary ? "same" : "another",
        r.cost_aware ? "guesses only what pays" : "guesses the whole window");
  out += "\n";
  add("prompt %lld tokens", static_cast<long long>(r.prompt_tokens));
  if (r.method == "prediction") add(", prediction %lld tokens", static_cast<long long>(r.prediction_tokens));
  add(", %lld generated (greedy); threads %d, %d reps: median [min .. max]\n", static_cast<long long>(r.generated), r.threads, r.reps);
  auto row = [&](const char* name, const summary& s, const char* unit) {
    add("%-24s %10.2f %-6s [%.2f .. %.2f]\n", name, s.median, unit, s.min, s.max);
  };
  row("decode, plain", r.decode_tok_s_plain, "tok/s");
  row("decode, speculative", r.decode_tok_s_spec, "tok/s");
  row("speed-up", r.speedup, "x");
  add("%-24s %10.3f (%lld of %lld proposed)\n", "acceptance rate", r.acceptance_rate, static_cast<long long>(r.accepted),
      static_cast<long long>(r.proposed));
  add("%-24s %10.2f\n", "tokens per pass", r.tokens_per_pass);
  if (!r.draft_path.empty()) add("%-24s %10.3f ms\n", "draft per token", r.draft_ms_per_token);
  add("%-24s %10s\n", "outputs identical", r.identical ? "yes" : "NO");
  return out;
}

}  // namespace tandem::bench
