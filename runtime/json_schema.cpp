// Schema to grammar in one walk: every schema node becomes a GBNF expression; objects, arrays
// and $ref targets get rules of their own (named from the path, so a grammar can be read).
#include "runtime/json_schema.h"

#include <cstdio>
#include <map>
#include <set>
#include <vector>

namespace tandem::runtime {

namespace {

using ojson = nlohmann::ordered_json;

// The JSON grammar's fixed rules. ws is one space, or a newline and an indent of at most 20
// (a model cannot pad without end); members and items carry their trailing ws, so
// no two ws meet and a parse never branches on where whitespace belongs.
constexpr const char* k_base = R"(ws ::= (" " | "\n" [ \t]{0,20})?
char ::= [^"\\\x00-\x1f] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
string ::= "\"" char* "\""
integer ::= "-"? ("0" | [1-9] [0-9]{0,15})
number ::= integer ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?
boolean ::= "true" | "false"
null ::= "null"
value ::= object | array | string | number | boolean | null
object ::= "{" ws (string ws ":" ws value ws ("," ws string ws ":" ws value ws)*)? "}"
array ::= "[" ws (value ws ("," ws value ws)*)? "]"
)";

constexpr const char* k_formats = R"(date ::= [0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [12] [0-9] | "3" [01])
time ::= ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? ("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])
hex ::= [0-9a-fA-F]
)";

const std::set<std::string> k_annotations = {"title",    "description", "default",  "examples",  "$schema", "$id",
                                             "$comment", "deprecated",  "readOnly", "writeOnly", "$defs",   "definitions"};

std::string literal(const std::string& bytes) {
  std::string out = "\"";
  for (const char c : bytes) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string pointer_token(const std::string& key) {
  std::string out;
  for (const char c : key) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
  return out;
}

class converter {
 public:
  explicit converter(const ojson& root) : root_(root) {}

  std::string run() {
    const std::string top = visit(root_, "");
    std::string out = "root ::= ws " + top + "\n" + k_base;
    if (formats_) out += k_formats;
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    return out;
  }

 private:
  [[noreturn]] static void fail(const std::string& what, const std::string& path) {
    throw schema_error("JSON schema: " + what + " at " + (path.empty() ? "/" : path));
  }

  std::string rule_name(const std::string& path) {
    std::string base = "s";
    for (const char c : path) base += (std::isalnum(static_cast<unsigned char>(c)) != 0) ? c : '-';
    std::string name = base;
    for (int i = 2; taken_.count(name); ++i) name = base + "-" + std::to_string(i);
    taken_.insert(name);
    return name;
  }

  std::string define(const std::string& path, std::string body) {
    const std::string name = rule_name(path);
    rules_.emplace_back(name, std::move(body));
    return name;
  }

  const ojson& resolve(const std::string& ref, const std::string& path) const {
    if (ref.empty() || ref[0] != '#') fail("$ref '" + ref + "' is not within this schema (only '#...' references are supported)", path);
    const ojson* at = &root_;
    size_t i = 1;
    if (i < ref.size() && ref[i] != '/') fail("$ref '" + ref + "' is not a JSON pointer", path);
    while (i < ref.size()) {
      const size_t next = ref.find('/', i + 1);
      std::string token = ref.substr(i + 1, next == std::string::npos ? std::string::npos : next - i - 1);
      std::string key;
      for (size_t k = 0; k < token.size(); ++k)
        if (token[k] == '~' && k + 1 < token.size() && (token[k + 1] == '0' || token[k + 1] == '1'))
          key += token[++k] == '0' ? '~' : '/';
        else
          key += token[k];
      if (at->is_object() && at->contains(key))
        at = &(*at)[key];
      else if (at->is_array() && !key.empty() && key.find_first_not_of("0123456789") == std::string::npos && std::stoull(key) < at->size())
        at = &(*at)[std::stoull(key)];
      else
        fail("$ref '" + ref + "' points at nothing", path);
      i = next == std::string::npos ? ref.size() : next;
    }
    return *at;
  }

  // Fails on any keyword outside `allowed` and the annotations.
  static void only(const ojson& s, std::initializer_list<const char*> allowed, const std::string& path, const std::string& context) {
    for (const auto& [k, v] : s.items()) {
      if (k_annotations.count(k)) continue;
      bool ok = false;
      for (const char* a : allowed) ok = ok || k == a;
      if (!ok) fail("keyword '" + k + "' is not supported" + (context.empty() ? "" : " " + context), path);
    }
  }

  std::string visit(const ojson& s, const std::string& path) {
    if (++depth_ > 64) fail("nested more than 64 deep", path);
    struct leave {
      int& d;
      ~leave() { --d; }
    } guard{depth_};
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail("the schema false matches nothing", path);
      return "value";
    }
    if (!s.is_object()) fail("a schema must be an object or a boolean", path);
    if (s.contains("$ref")) {
      only(s, {"$ref"}, path, "beside $ref");
      if (!s["$ref"].is_string()) fail("$ref must be a string", path);
      const std::string ref = s["$ref"].get<std::string>();
      if (const auto it = refs_.find(ref); it != refs_.end()) return it->second;
      const std::string name = rule_name("ref" + ref.substr(1));
      refs_.emplace(ref, name);
      const size_t at = rules_.size();
      rules_.emplace_back(name, "");
      const std::string body = visit(resolve(ref, path), ref.substr(1));
      rules_[at].second = body;
      return name;
    }
    for (const char* key : {"anyOf", "oneOf"})
      if (s.contains(key)) {
        only(s, {key}, path, std::string("beside ") + key);
        const auto& list = s[key];
        if (!list.is_array() || list.empty()) fail(std::string(key) + " must be a non-empty array", path);
        std::string out = "(";
        for (size_t i = 0; i < list.size(); ++i) out += (i ? " | " : "") + visit(list[i], path + "/" + key + "/" + std::to_string(i));
        return out + ")";
      }
    if (s.contains("allOf")) {
      only(s, {"allOf"}, path, "beside allOf");
      const auto& list = s["allOf"];
      if (!list.is_array() || list.size() != 1) fail("allOf of more than one schema is not supported", path);
      return visit(list[0], path + "/allOf/0");
    }
    if (s.contains("const")) {
      only(s, {"const", "type"}, path, "beside const");
      return literal(s["const"].dump());
    }
    if (s.contains("enum")) {
      only(s, {"enum", "type"}, path, "beside enum");
      const auto& list = s["enum"];
      if (!list.is_array() || list.empty()) fail("enum must be a non-empty array", path);
      std::string out = "(";
      for (size_t i = 0; i < list.size(); ++i) out += (i ? " | " : "") + literal(list[i].dump());
      return out + ")";
    }
    if (!s.contains("type")) {
      if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) return typed(s, "object", path);
      if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) return typed(s, "array", path);
      if (s.contains("minLength") || s.contains("maxLength") || s.contains("format")) return typed(s, "string", path);
      only(s, {}, path, "");
      return "value";
    }
    const auto& t = s["type"];
    if (t.is_string()) return typed(s, t.get<std::string>(), path);
    if (!t.is_array() || t.empty()) fail("type must be a string or a non-empty array of strings", path);
    std::string out = "(";
    for (size_t i = 0; i < t.size(); ++i) {
      if (!t[i].is_string()) fail("type must be a string or a non-empty array of strings", path);
      out += (i ? " | " : "") + typed(s, t[i].get<std::string>(), path);
    }
    return out + ")";
  }

  static int64_t count(const ojson& s, const char* key, const std::string& path) {
    if (!s.contains(key)) return -1;
    const auto& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) fail(std::string(key) + " must be a non-negative integer", path);
    if (v.get<int64_t>() > 10000) fail(std::string(key) + " above 10000 is not supported", path);
    return v.get<int64_t>();
  }

  static std::string repeat(int64_t min, int64_t max) {
    if (max < 0) return "{" + std::to_string(min) + ",}";
    return "{" + std::to_string(min) + "," + std::to_string(max) + "}";
  }

  std::string typed(const ojson& s, const std::string& type, const std::string& path) {
    if (type == "null") {
      only(s, {"type"}, path, "for type null");
      return "null";
    }
    if (type == "boolean") {
      only(s, {"type"}, path, "for type boolean");
      return "boolean";
    }
    if (type == "integer" || type == "number") {
      only(s, {"type"}, path, "for type " + type);
      return type;
    }
    if (type == "string") return string_of(s, path);
    if (type == "array") return array_of(s, path);
    if (type == "object") return object_of(s, path);
    fail("unknown type '" + type + "'", path);
  }

  std::string string_of(const ojson& s, const std::string& path) {
    only(s, {"type", "minLength", "maxLength", "format"}, path, "for type string");
    if (s.contains("format")) {
      if (s.contains("minLength") || s.contains("maxLength")) fail("minLength / maxLength beside format is not supported", path);
      const auto& f = s["format"];
      const std::string name = f.is_string() ? f.get<std::string>() : "";
      formats_ = true;
      if (name == "date" || name == "time") return "\"\\\"\" " + name + " \"\\\"\"";
      if (name == "date-time") return "\"\\\"\" date \"T\" time \"\\\"\"";
      if (name == "uuid") return "\"\\\"\" hex{8} \"-\" hex{4} \"-\" hex{4} \"-\" hex{4} \"-\" hex{12} \"\\\"\"";
      fail("format '" + (f.is_string() ? name : f.dump()) + "' is not supported (date, time, date-time and uuid are)", path);
    }
    const int64_t min = count(s, "minLength", path), max = count(s, "maxLength", path);
    if (min < 0 && max < 0) return "string";
    if (max >= 0 && max < std::max<int64_t>(min, 0)) fail("maxLength is below minLength", path);
    return "\"\\\"\" char" + repeat(std::max<int64_t>(min, 0), max) + " \"\\\"\"";
  }

  std::string array_of(const ojson& s, const std::string& path) {
    only(s, {"type", "items", "minItems", "maxItems"}, path, "for type array");
    const std::string item = s.contains("items") ? visit(s["items"], path + "/items") : "value";
    const int64_t min = std::max<int64_t>(count(s, "minItems", path), 0), max = count(s, "maxItems", path);
    if (max >= 0 && max < min) fail("maxItems is below minItems", path);
    if (max == 0) return define(path, "\"[\" ws \"]\"");
    const std::string more = "(\",\" ws " + item + " ws)" + repeat(std::max<int64_t>(min - 1, 0), max < 0 ? -1 : max - 1);
    const std::string first = item + " ws " + more;
    return define(path, "\"[\" ws " + (min == 0 ? "(" + first + ")?" : first) + " \"]\"");
  }

  std::string object_of(const ojson& s, const std::string& path) {
    only(s, {"type", "properties", "required", "additionalProperties"}, path, "for type object");
    const ojson empty = ojson::object();
    const ojson& props = s.contains("properties") ? s["properties"] : empty;
    if (!props.is_object()) fail("properties must be an object", path);
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) fail("required must be an array of strings", path);
      for (const auto& r : s["required"]) {
        if (!r.is_string()) fail("required must be an array of strings", path);
        if (!props.contains(r.get<std::string>())) fail("required names '" + r.get<std::string>() + "', which is not in properties", path);
        required.insert(r.get<std::string>());
      }
    }
    std::string extra;  // the value schema of other keys, when any may appear
    if (s.contains("additionalProperties")) {
      const auto& ap = s["additionalProperties"];
      if (!(ap.is_boolean() && !ap.get<bool>())) {
        if (!props.empty()) fail("additionalProperties other than false beside properties is not supported", path);
        extra = visit(ap, path + "/additionalProperties");
      }
    } else if (props.empty()) {
      extra = "value";
    }
    if (props.empty()) {
      if (extra.empty()) return define(path, "\"{\" ws \"}\"");
      const std::string member = "string ws \":\" ws " + extra + " ws";
      return define(path, "\"{\" ws (" + member + " (\",\" ws " + member + ")*)? \"}\"");
    }
    std::vector<std::string> req, opt;
    for (const auto& [key, sub] : props.items()) {
      const std::string member = literal(ojson(key).dump()) + " ws \":\" ws " + visit(sub, path + "/properties/" + pointer_token(key)) + " ws";
      (required.count(key) ? req : opt).push_back(member);
    }
    std::string body = "\"{\" ws";
    if (!req.empty()) {
      for (size_t i = 0; i < req.size(); ++i) body += (i ? " \",\" ws " : " ") + req[i];
      for (const auto& o : opt) body += " (\",\" ws " + o + ")?";
    } else {
      // At least one of o_i..o_m, in order: O_i ::= o_i ("," O_(i+1))? | O_(i+1).
      std::string next;
      for (size_t i = opt.size(); i-- > 0;) {
        const std::string name = rule_name(path + "/optional-" + std::to_string(i));
        rules_.emplace_back(name, next.empty() ? opt[i] : opt[i] + " (\",\" ws " + next + ")? | " + next);
        next = name;
      }
      body += " " + next + "?";
    }
    return define(path, body + " \"}\"");
  }

  const ojson& root_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::set<std::string> taken_ = {"root", "ws",    "char",   "string", "integer", "number", "boolean",
                                  "null", "value", "object", "array",  "date",    "time",   "hex"};
  std::map<std::string, std::string> refs_;
  bool formats_ = false;
  int depth_ = 0;
};

}  // namespace

std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema) { return converter(schema).run(); }

std::string json_object_gbnf() { return std::string("root ::= ws object\n") + k_base; }

}  // namespace tandem::runtime
