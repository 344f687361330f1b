// Test helper: a YAML document as JSON (scalars typed as YAML 1.2's core schema reads them),
// and a validator for the subset of JSON Schema that configs/roster.schema.json uses (type,
// properties, required, additionalProperties: false, items, minItems, enum, const, minimum,
// maximum, minLength, pattern, oneOf, local $ref). Errors are returned as "path: why".
#pragma once

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <regex>
#include <string>
#include <vector>

namespace tandem::test {

inline nlohmann::json yaml_to_json(const YAML::Node& n) {
  if (n.IsMap()) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& kv : n) j[kv.first.Scalar()] = yaml_to_json(kv.second);
    return j;
  }
  if (n.IsSequence()) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& e : n) j.push_back(yaml_to_json(e));
    return j;
  }
  if (n.IsNull()) return nullptr;
  const std::string& s = n.Scalar();
  if (n.Tag() == "!") return s;  // quoted: a string whatever it looks like
  if (s == "true" || s == "false") return s == "true";
  if (std::regex_match(s, std::regex("-?[0-9]+"))) return std::stoll(s);
  if (std::regex_match(s, std::regex("-?[0-9]+\\.[0-9]*([eE][-+]?[0-9]+)?"))) return std::stod(s);
  return s;
}

class json_schema_check {
 public:
  explicit json_schema_check(nlohmann::json schema) : root_(std::move(schema)) {}

  std::vector<std::string> errors(const nlohmann::json& doc) const {
    std::vector<std::string> out;
    check(root_, doc, "$", out);
    return out;
  }

 private:
  const nlohmann::json& resolve(const nlohmann::json& s) const {
    if (s.contains("$ref")) {
      const std::string ref = s["$ref"];
      return root_.at("$defs").at(ref.substr(std::string("#/$defs/").size()));
    }
    return s;
  }
  static bool has_type(const nlohmann::json& v, const std::string& t) {
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    if (t == "string") return v.is_string();
    if (t == "integer") return v.is_number_integer() || v.is_number_unsigned();
    if (t == "number") return v.is_number();
    if (t == "boolean") return v.is_boolean();
    if (t == "null") return v.is_null();
    return false;
  }
  void check(const nlohmann::json& schema, const nlohmann::json& v, const std::string& path, std::vector<std::string>& out) const {
    const nlohmann::json& s = resolve(schema);
    if (s.contains("oneOf")) {
      int matches = 0;
      for (const auto& alt : s["oneOf"]) {
        std::vector<std::string> sub;
        check(alt, v, path, sub);
        matches += sub.empty() ? 1 : 0;
      }
      if (matches != 1) out.push_back(path + ": matches " + std::to_string(matches) + " of the oneOf alternatives, not exactly one");
    }
    if (s.contains("type") && !has_type(v, s["type"])) {
      out.push_back(path + ": expected " + s["type"].get<std::string>() + ", got " + v.dump());
      return;
    }
    if (s.contains("const") && v != s["const"]) out.push_back(path + ": expected " + s["const"].dump());
    if (s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end())
      out.push_back(path + ": " + v.dump() + " is not one of " + s["enum"].dump());
    if (v.is_number()) {
      if (s.contains("minimum") && v.get<double>() < s["minimum"].get<double>()) out.push_back(path + ": below the minimum");
      if (s.contains("maximum") && v.get<double>() > s["maximum"].get<double>()) out.push_back(path + ": above the maximum");
    }
    if (v.is_string()) {
      const auto str = v.get<std::string>();
      if (s.contains("minLength") && str.size() < s["minLength"].get<size_t>()) out.push_back(path + ": too short");
      if (s.contains("pattern") && !std::regex_search(str, std::regex(s["pattern"].get<std::string>())))
        out.push_back(path + ": '" + str + "' does not match " + s["pattern"].get<std::string>());
    }
    if (v.is_object()) {
      for (const auto& r : s.value("required", nlohmann::json::array()))
        if (!v.contains(r.get<std::string>())) out.push_back(path + ": missing " + r.get<std::string>());
      const auto props = s.value("properties", nlohmann::json::object());
      for (const auto& [k, val] : v.items()) {
        if (props.contains(k))
          check(props[k], val, path + "." + k, out);
        else if (s.contains("additionalProperties") && s["additionalProperties"] == false)
          out.push_back(path + ": unexpected key " + k);
      }
    }
    if (v.is_array()) {
      if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) out.push_back(path + ": too few items");
      if (s.contains("items"))
        for (size_t i = 0; i < v.size(); ++i) check(s["items"], v[i], path + "[" + std::to_string(i) + "]", out);
    }
  }

  nlohmann::json root_;
};

}  // namespace tandem::test
