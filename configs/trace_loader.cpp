#include "configs/trace_loader.h"

#include <fstream>
#include <sstream>

#include "configs/yaml_reader.h"

namespace tandem::configs {
namespace {

using detail::reader;

void check_model(const reader& r, const YAML::Node& at, const std::string& path, const std::string& name, const roster& ro) {
  if (!ro.find(name)) r.fail(at, path, "no model named '" + name + "' in the roster " + ro.source);
}

double rate(const reader& r, const YAML::Node& n, const std::string& path) {
  // "2/s", "30/min", "100/h", or a bare number per second.
  if (n.IsScalar()) {
    const std::string s = n.Scalar();
    const auto slash = s.find('/');
    const std::string num = s.substr(0, slash);
    const std::string unit = slash == std::string::npos ? "s" : s.substr(slash + 1);
    const double per = unit == "s" ? 1 : unit == "min" ? 60 : unit == "h" ? 3600 : 0;
    try {
      size_t used = 0;
      const double v = std::stod(num, &used);
      if (used == num.size() && per > 0 && v >= 0 && v < 1e6) return v / per;
    } catch (...) {
    }
  }
  r.fail(n, path, "expected a rate such as 2/s, 30/min or 100/h, got " + reader::kind(n));
}

length_range lengths(const reader& r, const YAML::Node& n, const std::string& path) {
  length_range l;
  if (n.IsScalar()) {
    l.min = l.max = r.integer(n, path, 1, 1 << 24);
    return l;
  }
  r.only_keys(n, path, {"min", "max"});
  if (!n["min"] || !n["max"]) r.fail(n, path, "expected a number of tokens, or min and max");
  l.min = r.integer(n["min"], path + ".min", 1, 1 << 24);
  l.max = r.integer(n["max"], path + ".max", l.min, 1 << 24);
  return l;
}

}  // namespace

trace_spec parse_trace(std::string_view yaml, const std::string& source, const roster& ro) {
  const reader r(source, "");
  YAML::Node doc;
  try {
    doc = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    throw config_error(r.where(e.mark.line, e.mark.column) + "malformed YAML: " + e.msg);
  }
  r.only_keys(doc, "", {"length", "seed", "costs", "slo", "streams", "requests"});
  trace_spec t;
  t.source = source;
  if (doc["length"]) t.length = r.time(doc["length"], "length");
  if (doc["seed"]) t.seed = static_cast<uint64_t>(r.integer(doc["seed"], "seed", 0, INT64_MAX));
  if (const auto c = doc["costs"]) {
    r.only_keys(c, "costs", {"link_gb_s", "disk_gb_s", "step_overhead", "process_start", "models"});
    if (c["link_gb_s"]) t.costs.link_gb_s = r.number(c["link_gb_s"], "costs.link_gb_s", 1e-3, 1e4);
    if (c["disk_gb_s"]) t.costs.disk_gb_s = r.number(c["disk_gb_s"], "costs.disk_gb_s", 1e-3, 1e4);
    if (c["step_overhead"]) t.costs.step_overhead = r.time(c["step_overhead"], "costs.step_overhead");
    if (c["process_start"]) t.costs.process_start = r.time(c["process_start"], "costs.process_start");
    if (const auto ms = c["models"]) {
      r.expect_map(ms, "costs.models");
      for (const auto& kv : ms) {
        const std::string name = kv.first.Scalar(), path = "costs.models." + name;
        check_model(r, kv.first, path, name, ro);
        r.only_keys(kv.second, path, {"prefill_tok_s", "decode_tok_s", "batch_gain", "layers"});
        model_costs mc;
        if (kv.second["prefill_tok_s"]) mc.prefill_tok_s = r.number(kv.second["prefill_tok_s"], path + ".prefill_tok_s", 1e-3, 1e9);
        if (kv.second["decode_tok_s"]) mc.decode_tok_s = r.number(kv.second["decode_tok_s"], path + ".decode_tok_s", 1e-3, 1e9);
        if (kv.second["batch_gain"]) mc.batch_gain = r.number(kv.second["batch_gain"], path + ".batch_gain", 0, 1);
        if (kv.second["layers"]) mc.layers = static_cast<int>(r.integer(kv.second["layers"], path + ".layers", 1, 4096));
        t.costs.models[name] = mc;
      }
    }
  }
  for (const auto& m : ro.models)
    if (m.role != model_role::draft && m.role != model_role::medusa && !t.costs.models.count(m.name))
      r.fail(doc["costs"] ? doc["costs"] : doc, "costs.models", "no costs for model '" + m.name + "' (prefill_tok_s, decode_tok_s)");
  if (const auto s = doc["slo"]) {
    r.expect_map(s, "slo");
    for (const auto& kv : s) {
      check_model(r, kv.first, "slo." + kv.first.Scalar(), kv.first.Scalar(), ro);
      t.slo_ttft[kv.first.Scalar()] = r.time(kv.second, "slo." + kv.first.Scalar());
    }
  }
  if (const auto ss = doc["streams"]) {
    if (!ss.IsSequence()) r.fail(ss, "streams", "expected a list, got " + reader::kind(ss));
    for (size_t i = 0; i < ss.size(); ++i) {
      const auto n = ss[i];
      const std::string path = "streams[" + std::to_string(i) + "]";
      r.only_keys(n, path, {"model", "kind", "rate", "on", "off", "prompt", "output"});
      stream_spec st;
      st.seed = i + 1;
      if (!n["model"] || !n["rate"] || !n["prompt"] || !n["output"]) r.fail(n, path, "needs model, rate, prompt and output");
      st.model = r.string(n["model"], path + ".model");
      check_model(r, n["model"], path + ".model", st.model, ro);
      if (n["kind"]) st.bursts = r.choice<bool>(n["kind"], path + ".kind", {{"poisson", false}, {"bursts", true}});
      st.rate_per_s = rate(r, n["rate"], path + ".rate");
      if (st.bursts) {
        if (!n["on"] || !n["off"]) r.fail(n, path, "a bursts stream needs on and off durations");
        st.on = r.time(n["on"], path + ".on");
        st.off = r.time(n["off"], path + ".off");
      }
      st.prompt = lengths(r, n["prompt"], path + ".prompt");
      st.output = lengths(r, n["output"], path + ".output");
      t.streams.push_back(st);
    }
  }
  if (const auto rq = doc["requests"]) {
    if (!rq.IsSequence()) r.fail(rq, "requests", "expected a list, got " + reader::kind(rq));
    for (size_t i = 0; i < rq.size(); ++i) {
      const auto n = rq[i];
      const std::string path = "requests[" + std::to_string(i) + "]";
      r.only_keys(n, path, {"at", "model", "prompt", "output"});
      if (!n["at"] || !n["model"] || !n["prompt"] || !n["output"]) r.fail(n, path, "needs at, model, prompt and output");
      explicit_request e;
      e.at = r.time(n["at"], path + ".at");
      e.model = r.string(n["model"], path + ".model");
      check_model(r, n["model"], path + ".model", e.model, ro);
      e.prompt = r.integer(n["prompt"], path + ".prompt", 1, 1 << 24);
      e.output = r.integer(n["output"], path + ".output", 1, 1 << 24);
      t.requests.push_back(e);
    }
  }
  return t;
}

trace_spec load_trace(const std::string& path, const roster& r) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw config_error(path + ": cannot read the trace file");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_trace(text.str(), path, r);
}

}  // namespace tandem::configs
