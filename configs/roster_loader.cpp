#include "configs/roster_loader.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <sstream>

#include "configs/byte_size.h"
#include "configs/yaml_reader.h"

namespace tandem::configs {
namespace {

namespace fs = std::filesystem;
using detail::reader;

void read_server(const reader& r, const YAML::Node& n, server_config& s) {
  r.only_keys(n, "server", {"listen", "api_keys", "admin_keys", "limits"});
  if (n["listen"]) {
    s.listen = r.string(n["listen"], "server.listen");
    const auto colon = s.listen.rfind(':');
    bool ok = colon != std::string::npos && colon > 0 && colon + 1 < s.listen.size();
    if (ok) {
      try {
        size_t used = 0;
        const int port = std::stoi(s.listen.substr(colon + 1), &used);
        ok = used == s.listen.size() - colon - 1 && port >= 0 && port <= 65535;
      } catch (...) {
        ok = false;
      }
    }
    if (!ok) r.fail(n["listen"], "server.listen", "expected HOST:PORT with a port in [0, 65535], got '" + s.listen + "'");
  }
  if (n["api_keys"]) s.api_keys = r.strings(n["api_keys"], "server.api_keys");
  if (n["admin_keys"]) s.admin_keys = r.strings(n["admin_keys"], "server.admin_keys");
  if (const auto l = n["limits"]) {
    r.only_keys(l, "server.limits", {"max_body", "max_queue", "max_connections", "max_tokens", "request_timeout", "idle_timeout"});
    auto& L = s.limits;
    if (l["max_body"]) L.max_body_bytes = r.size(l["max_body"], "server.limits.max_body");
    if (l["max_queue"]) L.max_queue = static_cast<int>(r.integer(l["max_queue"], "server.limits.max_queue", 1, 1 << 20));
    if (l["max_connections"]) L.max_connections = static_cast<int>(r.integer(l["max_connections"], "server.limits.max_connections", 1, 1 << 20));
    if (l["max_tokens"]) L.max_tokens = r.integer(l["max_tokens"], "server.limits.max_tokens", 1, 1 << 24);
    if (l["request_timeout"]) L.request_timeout = r.time(l["request_timeout"], "server.limits.request_timeout");
    if (l["idle_timeout"]) L.idle_timeout = r.time(l["idle_timeout"], "server.limits.idle_timeout");
  }
}

device_config read_device(const reader& r, const YAML::Node& n, const std::string& path) {
  r.only_keys(n, path, {"name", "backend", "vram", "host", "link_gbps"});
  device_config d;
  d.line = n.Mark().line + 1;
  if (n["name"]) d.name = r.string(n["name"], path + ".name");
  if (n["backend"])
    d.backend = r.choice<backend_choice>(n["backend"], path + ".backend",
                                         {{"auto", backend_choice::automatic}, {"cuda", backend_choice::cuda}, {"cpu", backend_choice::cpu}});
  if (!n["vram"]) r.fail(n, path, "missing key 'vram' (the device memory budget, e.g. 22GiB)");
  d.vram = r.size(n["vram"], path + ".vram");
  if (n["host"]) d.host = r.size(n["host"], path + ".host");
  if (n["link_gbps"]) d.link_gbps = r.number(n["link_gbps"], path + ".link_gbps", 0, 10000);
  return d;
}

model_entry read_model(const reader& r, const YAML::Node& n, const std::string& path) {
  r.only_keys(n, path, {"name",    "aliases", "path",          "role",    "priority",           "pinned",     "keep_alive",
                        "preload", "context", "max_sequences", "kv_type", "kv_rotate",          "kv_reserve", "kv_limit",
                        "draft",   "medusa",  "chat_template", "size",    "kv_bytes_per_token", "optional",   "speculate"});
  model_entry m;
  m.line = n.Mark().line + 1;
  if (!n["name"]) r.fail(n, path, "missing key 'name'");
  m.name = r.string(n["name"], path + ".name");
  if (m.name.empty()) r.fail(n["name"], path + ".name", "must not be empty");
  if (!n["path"]) r.fail(n, path, "missing key 'path' (the GGUF file)");
  m.path = r.string(n["path"], path + ".path");
  m.file = fs::path(m.path).is_absolute() || r.base().empty() ? m.path : (fs::path(r.base()) / m.path).lexically_normal().string();
  if (n["aliases"]) m.aliases = r.strings(n["aliases"], path + ".aliases");
  if (n["role"])
    m.role =
        r.choice<model_role>(n["role"], path + ".role",
                             {{"chat", model_role::chat}, {"code", model_role::code}, {"draft", model_role::draft}, {"medusa", model_role::medusa}});
  if (n["priority"]) m.priority = static_cast<int>(r.integer(n["priority"], path + ".priority", 0, 1000));
  if (n["pinned"]) m.pinned = r.boolean(n["pinned"], path + ".pinned");
  if (const auto k = n["keep_alive"]) {
    if (k.IsScalar() && (k.Scalar() == "-1" || k.Scalar() == "never"))
      m.keep_alive = {true, {}};
    else
      m.keep_alive = {false, r.time(k, path + ".keep_alive")};
  }
  if (n["preload"])
    m.preload = r.choice<preload_tier>(n["preload"], path + ".preload",
                                       {{"none", preload_tier::none}, {"host", preload_tier::host}, {"device", preload_tier::device}});
  if (n["context"]) m.context = r.integer(n["context"], path + ".context", 1, 1 << 24);
  if (n["max_sequences"]) m.max_sequences = static_cast<int>(r.integer(n["max_sequences"], path + ".max_sequences", 1, 256));
  if (n["kv_type"])
    m.kv_type = r.choice<kv_cache_type>(
        n["kv_type"], path + ".kv_type",
        {{"f16", kv_cache_type::f16}, {"f32", kv_cache_type::f32}, {"q8_0", kv_cache_type::q8_0}, {"q4_0", kv_cache_type::q4_0}});
  if (n["kv_rotate"]) m.kv_rotate = r.boolean(n["kv_rotate"], path + ".kv_rotate");
  if (n["draft"]) m.draft = r.string(n["draft"], path + ".draft");
  if (!m.draft.empty()) m.speculate.method = speculate_method::draft;
  if (const auto sp = n["speculate"]) {
    const std::string at = path + ".speculate";
    if (!sp.IsMap()) r.fail(sp, at, "expected a mapping {method: ngram | draft | off, max_tokens: N, cache: BOOL}");
    r.only_keys(sp, at, {"method", "max_tokens", "cache"});
    if (sp["method"])
      m.speculate.method = r.choice<speculate_method>(
          sp["method"], at + ".method", {{"off", speculate_method::off}, {"ngram", speculate_method::ngram}, {"draft", speculate_method::draft}});
    if (sp["max_tokens"]) m.speculate.max_tokens = static_cast<int>(r.integer(sp["max_tokens"], at + ".max_tokens", 1, 32));
    if (sp["cache"]) m.speculate.cache = r.boolean(sp["cache"], at + ".cache");
    if (m.speculate.method == speculate_method::draft && m.draft.empty())
      r.fail(sp["method"] ? sp["method"] : sp, at + ".method", "draft speculation needs a draft model attached ('draft: NAME')");
    if (m.speculate.cache && m.speculate.method != speculate_method::ngram)
      r.fail(sp["cache"], at + ".cache", "the n-gram cache is for method: ngram");
  }
  if (n["medusa"]) m.medusa = r.string(n["medusa"], path + ".medusa");
  if (n["chat_template"]) m.chat_template = r.string(n["chat_template"], path + ".chat_template");
  if (n["size"]) m.size_bytes = r.size(n["size"], path + ".size");
  if (n["kv_bytes_per_token"]) m.kv_bytes_per_token = r.size(n["kv_bytes_per_token"], path + ".kv_bytes_per_token");
  if (m.kv_bytes_per_token && *m.kv_bytes_per_token == 0) r.fail(n["kv_bytes_per_token"], path + ".kv_bytes_per_token", "must be > 0");
  // Stated as an f16 cache takes it (2 bytes an element, as read off the GGUF's shape); the
  // entry carries what its kv_type takes.
  if (m.kv_bytes_per_token) m.kv_bytes_per_token = kv_bytes_from_f16(*m.kv_bytes_per_token, m.kv_type);
  if (n["kv_reserve"]) m.kv_reserve = r.size(n["kv_reserve"], path + ".kv_reserve");
  if (n["kv_limit"]) m.kv_limit = r.size(n["kv_limit"], path + ".kv_limit");
  if (m.kv_limit && m.kv_reserve > *m.kv_limit)
    r.fail(n["kv_reserve"], path + ".kv_reserve",
           "a floor of " + format_byte_size(m.kv_reserve) + " is above the model's kv_limit of " + format_byte_size(*m.kv_limit));
  if (m.kv_limit && m.kv_bytes_per_token && *m.kv_limit < *m.kv_bytes_per_token * k_kv_block_tokens)
    r.fail(n["kv_limit"], path + ".kv_limit",
           format_byte_size(*m.kv_limit) + " is less than one KV block (" + std::to_string(k_kv_block_tokens) + " positions, " +
               format_byte_size(*m.kv_bytes_per_token * k_kv_block_tokens) + ")");

  if (n["optional"]) m.optional = r.boolean(n["optional"], path + ".optional");

  std::error_code ec;
  const bool present = fs::is_regular_file(m.file, ec);
  // Left out by parse_roster: to serve it needs its file; to simulate, its stated sizes.
  if (!present && m.optional && (r.options().require_files || !m.size_bytes || !m.kv_bytes_per_token)) {
    m.missing = true;
    return m;
  }
  if (r.options().require_files && !present)
    r.fail(n["path"], path + ".path", "model file '" + m.path + "' not found" + (m.file != m.path ? " (looked for " + m.file + ")" : ""));
  if (!present && (!m.size_bytes || !m.kv_bytes_per_token))
    r.fail(n["path"], path + ".path", "model file '" + m.path + "' is not there, so the entry must state 'size' and 'kv_bytes_per_token'");
  if (present && !m.size_bytes) m.size_bytes = static_cast<uint64_t>(fs::file_size(m.file, ec));
  return m;
}

void read_policy(const reader& r, const YAML::Node& n, policy_config& p) {
  r.only_keys(n, "policy", {"name", "home", "hysteresis", "max_wait", "prefetch", "idle_grace", "stream", "interleave", "itl_target", "itl_budget"});
  if (n["name"]) {
    p.name = r.string(n["name"], "policy.name");
    if (p.name != "tandem" && p.name != "exclusive" && p.name != "lru-keepalive" && p.name != "static")
      r.fail(n["name"], "policy.name", "expected one of tandem, exclusive, lru-keepalive, static, got '" + p.name + "'");
  }
  if (n["home"]) p.home = r.string(n["home"], "policy.home");
  if (n["hysteresis"]) p.hysteresis = r.time(n["hysteresis"], "policy.hysteresis");
  if (n["max_wait"]) p.max_wait = r.time(n["max_wait"], "policy.max_wait");
  if (n["prefetch"]) p.prefetch = r.boolean(n["prefetch"], "policy.prefetch");
  if (n["idle_grace"]) p.idle_grace = r.time(n["idle_grace"], "policy.idle_grace");
  if (n["stream"]) p.stream = r.boolean(n["stream"], "policy.stream");
  if (n["interleave"]) p.interleave = r.boolean(n["interleave"], "policy.interleave");
  if (n["itl_target"]) {
    // A pass longer than a few seconds is no latency target; 0 turns the target off.
    p.itl_target = r.time(n["itl_target"], "policy.itl_target");
    if (p.itl_target > std::chrono::seconds(10))
      r.fail(n["itl_target"], "policy.itl_target", "expected a duration of at most 10s (0: no target), got '" + n["itl_target"].Scalar() + "'");
  }
  if (n["itl_budget"]) p.itl_budget = r.number(n["itl_budget"], "policy.itl_budget", 0, 100);
}

// Names and aliases share one namespace; references must point at entries of the right role;
// what is pinned or preloaded must fit the budgets.
void check_roster(const reader& r, const YAML::Node& doc, roster& out) {
  const auto models = doc["models"];
  std::map<std::string, std::pair<int, std::string>> seen;  // name -> (line, what)
  for (size_t i = 0; i < out.models.size(); ++i) {
    const auto& m = out.models[i];
    const std::string path = "models[" + std::to_string(i) + "]";
    auto claim = [&](const std::string& name, const YAML::Node& at, const std::string& key) {
      const auto [it, fresh] = seen.emplace(name, std::pair{m.line, key});
      if (!fresh)
        r.fail(at, path + "." + key, "'" + name + "' is already used (line " + std::to_string(it->second.first) + ", " + it->second.second + ")");
    };
    claim(m.name, models[i]["name"], "name");
    for (size_t a = 0; a < m.aliases.size(); ++a) claim(m.aliases[a], models[i]["aliases"][a], "aliases[" + std::to_string(a) + "]");
  }
  for (size_t i = 0; i < out.models.size(); ++i) {
    const auto& m = out.models[i];
    const std::string path = "models[" + std::to_string(i) + "]";
    for (const auto& [key, target, role] : {std::tuple{"draft", m.draft, model_role::draft}, std::tuple{"medusa", m.medusa, model_role::medusa}}) {
      if (target.empty()) continue;
      const model_entry* t = out.find(target);
      if (!t) r.fail(models[i][key], path + "." + key, "no model named '" + target + "' in the roster");
      if (t->role != role)
        r.fail(models[i][key], path + "." + key, "'" + target + "' has role " + role_name(t->role) + ", expected " + role_name(role));
      if (m.role != model_role::chat && m.role != model_role::code)
        r.fail(models[i][key], path + "." + key, "only chat and code models take a " + std::string(key) + " model");
      // A draft runs several passes for each of its target's: only a smaller model pays.
      if (m.size_bytes && t->size_bytes && *t->size_bytes >= *m.size_bytes)
        r.fail(models[i][key], path + "." + key,
               "'" + target + "' (" + format_byte_size(*t->size_bytes) + ") is not smaller than '" + m.name + "' (" +
                   format_byte_size(*m.size_bytes) + "): a " + key + " model must cost less to run than the model it serves");
    }
  }
  if (!out.policy.home.empty() && !out.find(out.policy.home))
    r.fail(doc["policy"]["home"], "policy.home", "no model named '" + out.policy.home + "' in the roster");

  // Budgets of the first device (the one a single-device box serves from).
  const device_config& d = out.devices.front();
  uint64_t pinned = 0, on_device = 0, on_host = 0;
  std::string pinned_names;
  for (size_t i = 0; i < out.models.size(); ++i) {
    const auto& m = out.models[i];
    const std::string path = "models[" + std::to_string(i) + "]";
    const uint64_t weights = m.size_bytes.value_or(0);
    // KV is taken as it is used; only the floor is held from the start.
    const uint64_t kv = m.kv_reserve;
    if (m.kv_reserve > d.vram)
      r.fail(models[i]["kv_reserve"], path + ".kv_reserve",
             "a floor of " + format_byte_size(m.kv_reserve) + " of KV is more than the device budget of " + format_byte_size(d.vram) +
                 " (devices[0].vram)");
    if (kv_budget_bytes(m) && m.kv_bytes_per_token && *m.kv_bytes_per_token * static_cast<uint64_t>(m.context) > d.vram)
      r.fail(models[i]["context"] ? models[i]["context"] : models[i], path + ".context",
             "one sequence of " + std::to_string(m.context) + " positions needs " +
                 format_byte_size(*m.kv_bytes_per_token * static_cast<uint64_t>(m.context)) + " of KV cache, more than the device budget of " +
                 format_byte_size(d.vram) + " (devices[0].vram)");
    if (m.pinned) {
      pinned += weights + kv;
      pinned_names += (pinned_names.empty() ? "" : ", ") + m.name;
      if (pinned > d.vram)
        r.fail(models[i]["pinned"], path + ".pinned",
               "the pinned models (" + pinned_names + ") need " + format_byte_size(pinned) +
                   " of weights and KV on the device, more than the device budget of " + format_byte_size(d.vram) + " (devices[0].vram)");
    }
    if (m.pinned || m.preload == preload_tier::device) {
      on_device += weights + kv;
      if (on_device > d.vram)
        r.fail(models[i]["preload"] ? models[i]["preload"] : models[i]["pinned"], path + (models[i]["preload"] ? ".preload" : ".pinned"),
               "the models pinned or preloaded to the device need " + format_byte_size(on_device) + ", more than the device budget of " +
                   format_byte_size(d.vram) + " (devices[0].vram)");
    }
    if (m.preload == preload_tier::host) {
      on_host += weights;
      if (on_host > d.host)
        r.fail(models[i]["preload"], path + ".preload",
               "the models preloaded to the host need " + format_byte_size(on_host) + ", more than the host budget of " + format_byte_size(d.host) +
                   " (devices[0].host)");
    }
  }
}

}  // namespace

const model_entry* roster::find(const std::string& name_or_alias) const {
  for (const auto& m : models) {
    if (m.name == name_or_alias) return &m;
    for (const auto& a : m.aliases)
      if (a == name_or_alias) return &m;
  }
  return nullptr;
}

std::optional<uint64_t> kv_budget_bytes(const model_entry& m) {
  if (!m.kv_bytes_per_token) return std::nullopt;
  const uint64_t full = *m.kv_bytes_per_token * static_cast<uint64_t>(m.context) * static_cast<uint64_t>(m.max_sequences);
  return m.kv_limit ? std::min(full, *m.kv_limit) : full;
}

const char* speculate_method_name(speculate_method m) {
  switch (m) {
    case speculate_method::off:
      return "off";
    case speculate_method::ngram:
      return "ngram";
    case speculate_method::draft:
      return "draft";
  }
  return "?";
}

const char* role_name(model_role r) {
  switch (r) {
    case model_role::chat:
      return "chat";
    case model_role::code:
      return "code";
    case model_role::draft:
      return "draft";
    case model_role::medusa:
      return "medusa";
  }
  return "?";
}
const char* preload_name(preload_tier p) {
  switch (p) {
    case preload_tier::none:
      return "none";
    case preload_tier::host:
      return "host";
    case preload_tier::device:
      return "device";
  }
  return "?";
}
const char* backend_name(backend_choice b) {
  switch (b) {
    case backend_choice::automatic:
      return "auto";
    case backend_choice::cuda:
      return "cuda";
    case backend_choice::cpu:
      return "cpu";
  }
  return "?";
}

roster parse_roster(std::string_view yaml, const std::string& source, const std::string& base_dir, const roster_options& options) {
  const reader r(source, base_dir, options);
  YAML::Node doc;
  try {
    doc = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    throw config_error(r.where(e.mark.line, e.mark.column) + "malformed YAML: " + e.msg);
  }
  if (!doc.IsMap()) throw config_error(source + ":1:1: expected a mapping with the keys server, devices, models, policy");
  r.only_keys(doc, "", {"server", "devices", "models", "policy"});
  roster out;
  out.source = source;
  if (doc["server"]) read_server(r, doc["server"], out.server);
  const auto devices = doc["devices"];
  if (!devices) r.fail(doc, "", "missing key 'devices' (at least one: backend, vram, host)");
  if (!devices.IsSequence() || devices.size() == 0) r.fail(devices, "devices", "expected a non-empty list of devices, got " + reader::kind(devices));
  for (size_t i = 0; i < devices.size(); ++i) out.devices.push_back(read_device(r, devices[i], "devices[" + std::to_string(i) + "]"));
  const auto models = doc["models"];
  if (!models) r.fail(doc, "", "missing key 'models'");
  if (!models.IsSequence() || models.size() == 0) r.fail(models, "models", "expected a non-empty list of models, got " + reader::kind(models));
  for (size_t i = 0; i < models.size(); ++i) {
    auto m = read_model(r, models[i], "models[" + std::to_string(i) + "]");
    if (m.missing)
      out.skipped.push_back(m.name + " (" + m.file + " not found)");
    else
      out.models.push_back(std::move(m));
  }
  if (out.models.empty()) r.fail(models, "models", "every model is optional and none of their files is there");
  if (doc["policy"]) read_policy(r, doc["policy"], out.policy);
  check_roster(r, doc, out);
  return out;
}

roster load_roster(const std::string& path, const roster_options& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw config_error(path + ": cannot read the roster file");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_roster(text.str(), path, fs::path(path).parent_path().string(), options);
}

}  // namespace tandem::configs
