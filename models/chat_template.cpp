#include "models/chat_template.h"

#include <array>
#include <utility>
#include <vector>

namespace tandem::models {

namespace {

struct family_name {
  chat_template_kind kind;
  std::string_view name;
};

constexpr std::array<family_name, 9> k_names{{
    {chat_template_kind::chatml, "chatml"},
    {chat_template_kind::llama2, "llama2"},
    {chat_template_kind::llama3, "llama3"},
    {chat_template_kind::mistral, "mistral"},
    {chat_template_kind::gemma, "gemma"},
    {chat_template_kind::phi3, "phi3"},
    {chat_template_kind::deepseek, "deepseek"},
    {chat_template_kind::zephyr, "zephyr"},
    {chat_template_kind::plain, "plain"},
}};

// DeepSeek-Coder-instruct's template writes this (with its trailing newline) when the
// conversation carries no system message.
constexpr std::string_view k_deepseek_default_system =
    "You are an AI programming assistant, utilizing the Deepseek Coder model, developed by "
    "Deepseek Company, and you only answer questions related to computer science. For "
    "politically sensitive questions, security and privacy issues, and other non-computer "
    "science questions, you will refuse to answer\n";

bool contains(std::string_view haystack, std::string_view needle) { return haystack.find(needle) != std::string_view::npos; }

// Jinja's `trim` / Python's str.strip() for the ASCII whitespace that matters in prompts.
std::string_view trim(std::string_view s) {
  constexpr std::string_view ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

bool is_system(const chat_message& m) { return m.role == "system"; }

// Splits off a leading system message, the way templates that fold the system prompt into
// the first turn do (llama2, mistral, gemma). Later system messages are not special there.
std::pair<const chat_message*, std::span<const chat_message>> split_system(std::span<const chat_message> msgs) {
  if (!msgs.empty() && is_system(msgs.front())) return {&msgs.front(), msgs.subspan(1)};
  return {nullptr, msgs};
}

std::string render_chatml(std::span<const chat_message> msgs, bool gen) {
  std::string out;
  for (const auto& m : msgs) {
    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  }
  if (gen) out += "<|im_start|>assistant\n";
  return out;
}

// Meta's Llama-2-chat template: every user turn opens with BOS, the system prompt sits in a
// <<SYS>> block inside the first turn, contents are stripped, answers end with " </s>".
std::string render_llama2(std::span<const chat_message> msgs) {
  auto [sys, rest] = split_system(msgs);
  std::string out;
  bool first = true;
  for (const auto& m : rest) {
    std::string content = m.content;
    if (first && sys != nullptr) {
      content = "<<SYS>>\n" + sys->content + "\n<</SYS>>\n\n" + m.content;
    }
    first = false;
    if (m.role == "user") {
      out += "<s>[INST] ";
      out += trim(content);
      out += " [/INST]";
    } else if (m.role == "assistant") {
      out += " ";
      out += trim(content);
      out += " </s>";
    }
  }
  return out;
}

// Mistral's "v1" template (Mistral-7B-Instruct v0.1/v0.2 as published by mistralai): BOS
// once, " [INST] ... [/INST]" turns, the system prompt prefixed to the first user turn.
std::string render_mistral(std::span<const chat_message> msgs) {
  auto [sys, rest] = split_system(msgs);
  std::string out = "<s>";
  for (size_t i = 0; i < rest.size(); ++i) {
    const auto& m = rest[i];
    if (m.role == "user") {
      out += " [INST] ";
      if (i == 0 && sys != nullptr) out += sys->content + "\n\n";
      out += m.content + " [/INST]";
    } else if (m.role == "assistant") {
      out += " " + m.content + "</s>";
    }
  }
  return out;
}

std::string render_llama3(std::span<const chat_message> msgs, bool gen) {
  std::string out = "<|begin_of_text|>";
  for (const auto& m : msgs) {
    out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
    out += trim(m.content);
    out += "<|eot_id|>";
  }
  if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// Gemma has no system role: Gemma 3's template prefixes the system prompt (plus a blank
// line) to the first turn; the assistant role is called "model".
std::string render_gemma(std::span<const chat_message> msgs, bool gen) {
  auto [sys, rest] = split_system(msgs);
  std::string out = "<bos>";
  bool first = true;
  for (const auto& m : rest) {
    if (m.role != "user" && m.role != "assistant") continue;
    out += "<start_of_turn>";
    out += m.role == "assistant" ? "model" : "user";
    out += "\n";
    if (first && sys != nullptr) out += sys->content + "\n\n";
    first = false;
    out += trim(m.content);
    out += "<end_of_turn>\n";
  }
  if (gen) out += "<start_of_turn>model\n";
  return out;
}

// Phi-3-small / Phi-3.5 form: one "<|role|>\n...<|end|>\n" block per message; empty system
// messages are skipped. Without a generation prompt the template closes with EOS.
std::string render_phi3(std::span<const chat_message> msgs, bool gen) {
  std::string out;
  for (const auto& m : msgs) {
    if (m.role == "system" && m.content.empty()) continue;
    if (m.role != "system" && m.role != "user" && m.role != "assistant") continue;
    out += "<|" + m.role + "|>\n" + m.content + "<|end|>\n";
  }
  out += gen ? "<|assistant|>\n" : "<|endoftext|>";
  return out;
}

// DeepSeek-Coder-instruct: BOS, the system prompt written as is (no separator), then
// "### Instruction:" / "### Response:" blocks; answers end with "<|EOT|>".
std::string render_deepseek(std::span<const chat_message> msgs, bool gen) {
  std::string out = "<｜begin▁of▁sentence｜>";
  for (const auto& m : msgs) {
    if (m.role == "system") {
      out += m.content;
    } else if (m.role == "user") {
      out += "### Instruction:\n" + m.content + "\n";
    } else if (m.role == "assistant") {
      out += "### Response:\n" + m.content + "\n<|EOT|>\n";
    }
  }
  if (gen) out += "### Response:\n";
  return out;
}

// HuggingFaceH4 Zephyr: "<|role|>\n...</s>\n"; the generation prompt follows the last message.
std::string render_zephyr(std::span<const chat_message> msgs, bool gen) {
  std::string out;
  for (const auto& m : msgs) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant") continue;
    out += "<|" + m.role + "|>\n" + m.content + "</s>\n";
  }
  if (gen && !msgs.empty()) out += "<|assistant|>\n";
  return out;
}

// Models without a template get a transcript that base models continue sensibly.
std::string render_plain(std::span<const chat_message> msgs, bool gen) {
  std::string out;
  for (const auto& m : msgs) {
    if (m.role == "system") {
      out += "System: ";
    } else if (m.role == "user") {
      out += "User: ";
    } else if (m.role == "assistant") {
      out += "Assistant: ";
    } else {
      continue;
    }
    out += m.content + "\n";
  }
  if (gen) out += "Assistant:";
  return out;
}

// Undoes the escapes a Jinja string literal may use for the characters a system prompt
// contains; templates stored in GGUF carry either real newlines or "\n" escapes.
std::string unescape_jinja_literal(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      const char c = s[++i];
      switch (c) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        default:
          out += c;
          break;  // \\ \' \"
      }
    } else {
      out += s[i];
    }
  }
  return out;
}

// The system prompt a ChatML template writes by itself: a single string literal
// "<|im_start|>system\n<text><|im_end|>" whose <text> has no quotes or Jinja syntax (so it
// is not the user's system message spliced in).
std::string chatml_default_system(std::string_view jinja) {
  constexpr std::string_view head = "<|im_start|>system";
  constexpr std::string_view tail = "<|im_end|>";
  for (size_t at = jinja.find(head); at != std::string_view::npos; at = jinja.find(head, at + 1)) {
    size_t p = at + head.size();
    if (jinja.substr(p, 2) == "\\n") {
      p += 2;
    } else if (jinja.substr(p, 1) == "\n") {
      p += 1;
    } else {
      continue;
    }
    const size_t end = jinja.find(tail, p);
    if (end == std::string_view::npos) break;
    const std::string_view text = jinja.substr(p, end - p);
    if (text.empty() || text.find_first_of("'\"{}+") != std::string_view::npos) continue;
    return unescape_jinja_literal(text);
  }
  return {};
}

}  // namespace

std::optional<chat_template_kind> parse_chat_template_name(std::string_view name) {
  for (const auto& f : k_names) {
    if (f.name == name) return f.kind;
  }
  return std::nullopt;
}

std::string_view chat_template_name(chat_template_kind k) {
  for (const auto& f : k_names) {
    if (f.kind == k) return f.name;
  }
  return "plain";
}

chat_template_kind detect_chat_template(std::string_view t) {
  // Order matters: the more specific markers first (a Zephyr-like "<|user|>" appears in
  // Phi-3 templates too, "[INST]" in both Llama-2 and Mistral ones).
  if (contains(t, "<|im_start|>")) return chat_template_kind::chatml;
  if (contains(t, "<|start_header_id|>")) return chat_template_kind::llama3;
  if (contains(t, "<start_of_turn>")) return chat_template_kind::gemma;
  if (contains(t, "<|user|>")) {
    if (contains(t, "<|end|>")) return chat_template_kind::phi3;
    if (contains(t, "</s>") || contains(t, "eos_token")) return chat_template_kind::zephyr;
    return chat_template_kind::plain;  // e.g. ChatGLM: same tag, different format
  }
  if (contains(t, "[INST]")) {
    return contains(t, "<<SYS>>") ? chat_template_kind::llama2 : chat_template_kind::mistral;
  }
  if (contains(t, "### Instruction") || (contains(t, "User: ") && contains(t, "Assistant:"))) {
    return chat_template_kind::deepseek;
  }
  return chat_template_kind::plain;
}

std::string_view chat_template_bos_text(chat_template_kind k) {
  switch (k) {
    case chat_template_kind::llama2:
    case chat_template_kind::mistral:
      return "<s>";
    case chat_template_kind::llama3:
      return "<|begin_of_text|>";
    case chat_template_kind::gemma:
      return "<bos>";
    case chat_template_kind::deepseek:
      return "<｜begin▁of▁sentence｜>";
    default:
      return {};
  }
}

bool renders_bos(chat_template_kind k) { return !chat_template_bos_text(k).empty(); }

std::string_view family_default_system_prompt(chat_template_kind k) {
  return k == chat_template_kind::deepseek ? k_deepseek_default_system : std::string_view{};
}

chat_template chat_template_from_jinja(std::string_view jinja) {
  chat_template t;
  t.kind = detect_chat_template(jinja);
  t.default_system = t.kind == chat_template_kind::chatml ? chatml_default_system(jinja) : std::string(family_default_system_prompt(t.kind));
  return t;
}

std::string apply_chat_template(chat_template_kind k, std::span<const chat_message> msgs, bool add_generation_prompt) {
  return apply_chat_template(chat_template{k, std::string(family_default_system_prompt(k))}, msgs, add_generation_prompt);
}

std::string apply_chat_template(const chat_template& t, std::span<const chat_message> msgs, bool add_generation_prompt) {
  // Templates with a default system prompt check only the first message (SmolLM2, Qwen2).
  std::vector<chat_message> with_default;
  if (!t.default_system.empty() && !msgs.empty() && !is_system(msgs.front())) {
    with_default.reserve(msgs.size() + 1);
    with_default.push_back({"system", t.default_system});
    with_default.insert(with_default.end(), msgs.begin(), msgs.end());
    msgs = with_default;
  }
  const bool gen = add_generation_prompt;
  switch (t.kind) {
    case chat_template_kind::chatml:
      return render_chatml(msgs, gen);
    case chat_template_kind::llama2:
      return render_llama2(msgs);
    case chat_template_kind::llama3:
      return render_llama3(msgs, gen);
    case chat_template_kind::mistral:
      return render_mistral(msgs);
    case chat_template_kind::gemma:
      return render_gemma(msgs, gen);
    case chat_template_kind::phi3:
      return render_phi3(msgs, gen);
    case chat_template_kind::deepseek:
      return render_deepseek(msgs, gen);
    case chat_template_kind::zephyr:
      return render_zephyr(msgs, gen);
    case chat_template_kind::plain:
      return render_plain(msgs, gen);
  }
  return render_plain(msgs, gen);
}

}  // namespace tandem::models
