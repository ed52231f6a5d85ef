#include "k8s/block_yaml.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gpusnap::k8s {

namespace {

using nlohmann::json;

struct Line {
  int number = 0;    // 1-based, for messages
  size_t indent = 0;
  std::string text;  // without the indentation and trailing blanks
};

bool IsBlank(char c) { return c == ' ' || c == '\t'; }

std::string_view TrimRight(std::string_view s) {
  while (!s.empty() && (IsBlank(s.back()) || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

std::string_view TrimLeft(std::string_view s) {
  while (!s.empty() && IsBlank(s.front())) s.remove_prefix(1);
  return s;
}

// Blank lines and whole-line comments dropped; the document markers checked.
Result<std::vector<Line>> SplitLines(std::string_view text) {
  std::vector<Line> lines;
  bool ended = false;
  int number = 0;
  while (!text.empty()) {
    size_t eol = text.find('\n');
    std::string_view raw = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    ++number;
    raw = TrimRight(raw);
    size_t indent = 0;
    while (indent < raw.size() && IsBlank(raw[indent])) {
      if (raw[indent] == '\t')
        return Status::Error(Code::kInvalidArgument, "line {}: a tab in the indentation", number);
      ++indent;
    }
    std::string_view content = raw.substr(indent);
    if (content.empty() || content.front() == '#') continue;
    if (indent == 0 && (content == "---" || content.starts_with("--- "))) {
      if (!lines.empty() || ended)
        return Status::Error(Code::kInvalidArgument, "line {}: a second document; one is read", number);
      continue;
    }
    if (indent == 0 && content == "...") {
      ended = true;
      continue;
    }
    if (ended) return Status::Error(Code::kInvalidArgument, "line {}: text after the end of the document", number);
    lines.push_back({number, indent, std::string(content)});
  }
  return lines;
}

// A quoted scalar at the start of `s`: its value, and what follows it.
Result<std::pair<std::string, std::string_view>> Quoted(std::string_view s, int line) {
  const char quote = s.front();
  std::string out;
  size_t i = 1;
  for (; i < s.size(); ++i) {
    char c = s[i];
    if (quote == '\'') {
      if (c != '\'') {
        out += c;
      } else if (i + 1 < s.size() && s[i + 1] == '\'') {
        out += '\'';
        ++i;
      } else {
        break;
      }
      continue;
    }
    if (c == '"') break;
    if (c != '\\') {
      out += c;
      continue;
    }
    if (++i >= s.size()) break;
    switch (s[i]) {
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case '/': out += '/'; break;
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case '0': out += '\0'; break;
      case 'u': {
        if (i + 4 >= s.size())
          return Status::Error(Code::kInvalidArgument, "line {}: a short \\u escape", line);
        unsigned code = 0;
        for (size_t k = i + 1; k <= i + 4; ++k) {
          char h = s[k];
          unsigned digit = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                           : h >= 'A' && h <= 'F' ? h - 'A' + 10 : 16;
          if (digit == 16) return Status::Error(Code::kInvalidArgument, "line {}: a bad \\u escape", line);
          code = code * 16 + digit;
        }
        i += 4;
        // UTF-8 of one code unit (surrogate pairs are not joined).
        if (code < 0x80) {
          out += static_cast<char>(code);
        } else if (code < 0x800) {
          out += static_cast<char>(0xC0 | (code >> 6));
          out += static_cast<char>(0x80 | (code & 0x3F));
        } else {
          out += static_cast<char>(0xE0 | (code >> 12));
          out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
          out += static_cast<char>(0x80 | (code & 0x3F));
        }
        break;
      }
      default:
        return Status::Error(Code::kInvalidArgument, "line {}: the escape \\{} is not understood", line, s[i]);
    }
  }
  if (i >= s.size()) return Status::Error(Code::kInvalidArgument, "line {}: an unterminated quoted string", line);
  return std::make_pair(std::move(out), s.substr(i + 1));
}

// What may follow a scalar on its line: nothing, or a comment.
bool OnlyComment(std::string_view rest) {
  rest = TrimLeft(rest);
  return rest.empty() || rest.front() == '#';
}

// A plain scalar ends at " #" (a comment).
std::string_view Plain(std::string_view s) {
  for (size_t i = 1; i < s.size(); ++i)
    if (s[i] == '#' && IsBlank(s[i - 1])) return TrimRight(s.substr(0, i));
  return s;
}

Result<json> Scalar(std::string_view s, int line) {
  s = TrimLeft(s);
  if (s.empty() || s.front() == '#') return json(nullptr);
  char c = s.front();
  if (c == '"' || c == '\'') {
    GPUSNAP_ASSIGN_OR_RETURN(auto quoted, Quoted(s, line));
    if (!OnlyComment(quoted.second))
      return Status::Error(Code::kInvalidArgument, "line {}: text after a quoted string", line);
    return json(quoted.first);
  }
  if (c == '{' || c == '[') {
    std::string_view v = Plain(s);
    if (v == "{}") return json::object();
    if (v == "[]") return json::array();
    return Status::Error(Code::kInvalidArgument, "line {}: flow collections with content are not read", line);
  }
  if (c == '|' || c == '>')
    return Status::Error(Code::kInvalidArgument, "line {}: block scalars (| and >) are not read", line);
  if (c == '&' || c == '*' || c == '!')
    return Status::Error(Code::kInvalidArgument, "line {}: anchors, aliases and tags are not read", line);
  return json(std::string(Plain(s)));
}

// "key: value" or "key:" at the start of `s`: the key and what follows the
// colon; nullopt when `s` is no mapping entry.
Result<std::optional<std::pair<std::string, std::string_view>>> Entry(std::string_view s, int line) {
  if (s.front() == '"' || s.front() == '\'') {
    GPUSNAP_ASSIGN_OR_RETURN(auto quoted, Quoted(s, line));
    std::string_view rest = TrimLeft(quoted.second);
    if (rest.empty() || rest.front() != ':' || (rest.size() > 1 && !IsBlank(rest[1])))
      return std::optional<std::pair<std::string, std::string_view>>();
    return std::make_optional(std::make_pair(std::move(quoted.first), rest.substr(1)));
  }
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '#' && i > 0 && IsBlank(s[i - 1])) break;
    if (s[i] == ':' && (i + 1 == s.size() || IsBlank(s[i + 1])))
      return std::make_optional(std::make_pair(std::string(TrimRight(s.substr(0, i))), s.substr(i + 1)));
  }
  return std::optional<std::pair<std::string, std::string_view>>();
}

bool IsItem(std::string_view text) { return text == "-" || text.starts_with("- "); }

class Parser {
 public:
  explicit Parser(std::vector<Line> lines) : lines_(std::move(lines)) {}

  Result<json> Document() {
    if (lines_.empty()) return json(nullptr);
    GPUSNAP_ASSIGN_OR_RETURN(json root, Node());
    if (i_ < lines_.size())
      return Status::Error(Code::kInvalidArgument, "line {}: indented less than the document", lines_[i_].number);
    return root;
  }

 private:
  // The collection starting at the current line.
  Result<json> Node() {
    const Line& line = lines_[i_];
    return IsItem(line.text) ? Sequence(line.indent) : Mapping(line.indent);
  }

  // After a value that ended on its line: nothing may be nested under it.
  Status NothingNested(size_t indent) const {
    if (i_ < lines_.size() && lines_[i_].indent > indent)
      return Status::Error(Code::kInvalidArgument, "line {}: indented under a value that is complete",
                           lines_[i_].number);
    return Status::Ok();
  }

  // The value of a key or item whose line ended after its ":" or "-".
  Result<json> NestedValue(size_t indent, bool sequence_may_align) {
    if (i_ < lines_.size() && lines_[i_].indent > indent) return Node();
    if (sequence_may_align && i_ < lines_.size() && lines_[i_].indent == indent && IsItem(lines_[i_].text))
      return Sequence(indent);
    return json(nullptr);
  }

  Result<json> Mapping(size_t indent) {
    json out = json::object();
    while (i_ < lines_.size() && lines_[i_].indent == indent && !IsItem(lines_[i_].text)) {
      const Line& line = lines_[i_];
      GPUSNAP_ASSIGN_OR_RETURN(auto entry, Entry(line.text, line.number));
      if (!entry)
        return Status::Error(Code::kInvalidArgument, "line {}: expected `key: value`, got `{}`", line.number,
                             line.text);
      auto& [key, rest] = *entry;
      if (out.contains(key))
        return Status::Error(Code::kInvalidArgument, "line {}: the key `{}` appears twice", line.number, key);
      ++i_;
      json value;
      if (OnlyComment(rest)) {
        GPUSNAP_ASSIGN_OR_RETURN(value, NestedValue(indent, true));
      } else {
        GPUSNAP_ASSIGN_OR_RETURN(value, Scalar(rest, line.number));
        GPUSNAP_RETURN_IF_ERROR(NothingNested(indent));
      }
      out[key] = std::move(value);
    }
    GPUSNAP_RETURN_IF_ERROR(NothingNested(indent));
    return out;
  }

  Result<json> Sequence(size_t indent) {
    json out = json::array();
    while (i_ < lines_.size() && lines_[i_].indent == indent && IsItem(lines_[i_].text)) {
      Line& line = lines_[i_];
      std::string_view after_dash = std::string_view(line.text).substr(1);
      std::string_view rest = TrimLeft(after_dash);
      if (OnlyComment(rest)) {
        ++i_;
        GPUSNAP_ASSIGN_OR_RETURN(json value, NestedValue(indent, false));
        out.push_back(std::move(value));
        continue;
      }
      GPUSNAP_ASSIGN_OR_RETURN(auto entry, Entry(rest, line.number));
      if (entry || IsItem(rest)) {
        // A collection that begins on the dash line: that line, re-read as
        // if it started where the collection's first key or dash does.
        size_t inner = indent + 1 + (after_dash.size() - rest.size());
        line.text = std::string(rest);
        line.indent = inner;
        GPUSNAP_ASSIGN_OR_RETURN(json value, Node());
        out.push_back(std::move(value));
        continue;
      }
      ++i_;
      GPUSNAP_ASSIGN_OR_RETURN(json value, Scalar(rest, line.number));
      GPUSNAP_RETURN_IF_ERROR(NothingNested(indent));
      out.push_back(std::move(value));
    }
    return out;
  }

  std::vector<Line> lines_;
  size_t i_ = 0;
};

}  // namespace

Result<json> ParseBlockYaml(std::string_view text) {
  size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && text[first] == '{') {
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded()) return Status::Error(Code::kInvalidArgument, "the text starts with `{{` but is not JSON");
    return j;
  }
  GPUSNAP_ASSIGN_OR_RETURN(auto lines, SplitLines(text));
  return Parser(std::move(lines)).Document();
}

}  // namespace gpusnap::k8s
