#include "models/jinja/lexer.h"

#include <cctype>
#include <cstdint>

#include "models/jinja/error.h"
#include "models/unicode.h"

namespace tandem::models::jinja {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class lexer {
 public:
  explicit lexer(std::string_view s) : src_(s) {}

  std::vector<token> run() {
    bool strip_next = false;    // the tag before ended with '-': the text after loses its leading whitespace
    bool line_starting = true;  // the text about to be read starts a line
    while (pos_ < src_.size()) {
      const size_t at = next_tag(pos_);
      std::string text(src_.substr(pos_, at - pos_));
      const int text_line = line_;
      count_lines(pos_, at);
      if (strip_next) {
        size_t n = 0;
        while (n < text.size() && is_space(text[n])) ++n;
        if (n > 0 && text[n - 1] == '\n') line_starting = true;
        text.erase(0, n);
        strip_next = false;
      }
      if (at == src_.size()) {
        emit_text(std::move(text), text_line);
        break;
      }
      const char kind = src_[at + 1];
      const char ctrl = at + 2 < src_.size() ? src_[at + 2] : '\0';
      if (ctrl == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (kind != '{' && ctrl != '+') {
        // lstrip_blocks: only spaces between the line's start and the tag.
        const size_t l = text.rfind('\n');
        const size_t from = l == std::string::npos ? 0 : l + 1;
        if (from > 0 || line_starting) {
          bool blank = true;
          for (size_t i = from; i < text.size(); ++i) blank = blank && is_space(text[i]);
          if (blank) text.erase(from);
        }
      }
      emit_text(std::move(text), text_line);
      pos_ = at + 2 + ((ctrl == '-' || ctrl == '+') ? 1 : 0);
      char end_ctrl = '\0';
      if (kind == '#') {
        const size_t close = src_.find("#}", pos_);
        if (close == std::string_view::npos) throw error("the comment is never closed", line_);
        if (close > pos_ && (src_[close - 1] == '-' || src_[close - 1] == '+')) end_ctrl = src_[close - 1];
        count_lines(pos_, close);
        pos_ = close + 2;
      } else {
        end_ctrl = tag(kind);
      }
      line_starting = false;
      if (end_ctrl == '-') {
        strip_next = true;
      } else if (kind != '{' && end_ctrl != '+') {
        // trim_blocks: the first newline after a block or comment goes.
        if (src_.substr(pos_, 2) == "\r\n") {
          pos_ += 2;
          ++line_;
          line_starting = true;
        } else if (pos_ < src_.size() && src_[pos_] == '\n') {
          ++pos_;
          ++line_;
          line_starting = true;
        }
      }
    }
    out_.push_back({token::kind::end, {}, line_});
    return std::move(out_);
  }

 private:
  size_t next_tag(size_t from) const {
    for (size_t p = src_.find('{', from); p != std::string_view::npos; p = src_.find('{', p + 1))
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) return p;
    return src_.size();
  }

  void count_lines(size_t from, size_t to) {
    for (size_t i = from; i < to; ++i) line_ += src_[i] == '\n';
  }

  void emit_text(std::string text, int line) {
    if (!text.empty()) out_.push_back({token::kind::text, std::move(text), line});
  }

  // The tokens of a {{ }} or {% %} tag; returns the control character before its closing
  // delimiter ('-', '+' or '\0').
  char tag(char kind) {
    const bool var = kind == '{';
    out_.push_back({var ? token::kind::var_begin : token::kind::block_begin, {}, line_});
    const char close = var ? '}' : '%';
    int depth = 0;  // brackets open inside the tag: a "}}" in a dict literal does not close it
    const size_t first = out_.size();
    while (true) {
      // A bound on one tag's tokens bounds the depth of its expression trees (a chain of
      // operators parses to a tree as deep as it is long), which the renderer walks recursively.
      if (out_.size() - first > k_max_tag_tokens) throw error("a tag of more than " + std::to_string(k_max_tag_tokens) + " tokens", line_);
      while (pos_ < src_.size() && is_space(src_[pos_])) {
        line_ += src_[pos_] == '\n';
        ++pos_;
      }
      if (pos_ >= src_.size()) throw error(var ? "the {{ tag is never closed" : "the {% tag is never closed", line_);
      const char c = src_[pos_];
      char ctrl = '\0';
      size_t p = pos_;
      const std::string closer{close, '}'};
      if ((c == '-' || (c == '+' && !var)) && src_.substr(p + 1, 2) == closer) {
        ctrl = c;
        ++p;
      }
      if (depth == 0 && src_.substr(p, 2) == closer) {
        pos_ = p + 2;
        out_.push_back({var ? token::kind::var_end : token::kind::block_end, {}, line_});
        return ctrl;
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        out_.push_back({token::kind::name, std::string(src_.substr(pos_, e - pos_)), line_});
        pos_ = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        number();
      } else if (c == '\'' || c == '"') {
        string_literal(c);
      } else {
        static const char* two[] = {"**", "//", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* t : two)
          if (src_.substr(pos_, 2) == t) op = t;
        if (op.empty()) {
          if (std::string_view("+-*/%~|.,:()[]{}<>=").find(c) == std::string_view::npos)
            throw error(std::string("unexpected character '") + c + "' in a tag", line_);
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") ++depth;
        if ((op == ")" || op == "]" || op == "}") && depth > 0) --depth;
        out_.push_back({token::kind::op, op, line_});
        pos_ += op.size();
      }
    }
  }

  void number() {
    size_t e = pos_;
    while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
    bool real = false;
    if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      real = true;
      ++e;
      while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t x = e + 1;
      if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
      if (x < src_.size() && std::isdigit(static_cast<unsigned char>(src_[x]))) {
        real = true;
        e = x;
        while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
      }
    }
    std::string digits;
    for (size_t i = pos_; i < e; ++i)
      if (src_[i] != '_') digits += src_[i];
    out_.push_back({real ? token::kind::number : token::kind::integer, digits, line_});
    pos_ = e;
  }

  void string_literal(char quote) {
    const int start_line = line_;
    std::string out;
    size_t p = pos_ + 1;
    while (true) {
      if (p >= src_.size()) throw error("the string literal is never closed", start_line);
      const char c = src_[p];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\' || p + 1 >= src_.size()) {
        out += c;
        ++p;
        continue;
      }
      const char e = src_[p + 1];
      p += 2;
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case '\\':
        case '\'':
        case '"':
          out += e;
          break;
        case '\n':
          ++line_;  // a line continuation
          break;
        case 'u':
        case 'x': {
          const size_t n = e == 'u' ? 4 : 2;
          uint32_t cp = 0;
          for (size_t i = 0; i < n; ++i) {
            const char h = p + i < src_.size() ? src_[p + i] : '\0';
            if (!std::isxdigit(static_cast<unsigned char>(h))) throw error("a bad \\" + std::string(1, e) + " escape in a string literal", line_);
            cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
          }
          p += n;
          utf8_append(out, cp);
          break;
        }
        default:  // Python keeps an unknown escape as written
          out += '\\';
          out += e;
      }
    }
    out_.push_back({token::kind::string, std::move(out), start_line});
    pos_ = p + 1;
  }

  static constexpr size_t k_max_tag_tokens = 4096;
  std::string_view src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<token> out_;
};

}  // namespace

std::vector<token> tokenize(std::string_view source) {
  // jinja2 drops one newline at the end of the source (keep_trailing_newline off).
  if (source.ends_with("\r\n"))
    source.remove_suffix(2);
  else if (source.ends_with('\n'))
    source.remove_suffix(1);
  return lexer(source).run();
}

}  // namespace tandem::models::jinja
