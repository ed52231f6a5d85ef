#include "store/meta_digest.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "store/sha256.h"

namespace gpusnap {

namespace {

using nlohmann::json;

// A parsed value that remembers each scalar's canonical text.
struct Node {
  enum class Kind { kScalar, kObject, kArray } kind = Kind::kScalar;
  std::string scalar;
  std::vector<std::string> keys;  // kObject: keys[i] names values[i]
  std::vector<Node> values;       // kObject and kArray
};

// Builds Nodes from nlohmann's SAX events, which give a non-integer
// number's text as the file has it.
class Builder : public nlohmann::json_sax<json> {
 public:
  Node root;
  std::string failure;

  bool null() override { return Scalar("null"); }
  bool boolean(bool v) override { return Scalar(v ? "true" : "false"); }
  bool number_integer(number_integer_t v) override { return Scalar(std::to_string(v)); }
  bool number_unsigned(number_unsigned_t v) override { return Scalar(std::to_string(v)); }
  bool number_float(number_float_t, const string_t& text) override { return Scalar(text); }
  bool string(string_t& v) override { return Scalar(json(v).dump()); }
  bool binary(binary_t&) override { return Scalar("null"); }  // not produced by the text parser
  bool start_object(std::size_t) override { return Open(Node::Kind::kObject); }
  bool key(string_t& k) override {
    stack_.back()->keys.push_back(k);
    return true;
  }
  bool end_object() override { return Close(); }
  bool start_array(std::size_t) override { return Open(Node::Kind::kArray); }
  bool end_array() override { return Close(); }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
    failure = fmt::format("JSON syntax error at byte {}: {}", position, e.what());
    return false;
  }

 private:
  // The node the next value becomes.
  Node* Next() {
    if (stack_.empty()) return &root;
    stack_.back()->values.emplace_back();
    return &stack_.back()->values.back();
  }
  bool Scalar(std::string text) {
    Next()->scalar = std::move(text);
    return true;
  }
  bool Open(Node::Kind kind) {
    Node* n = Next();
    n->kind = kind;
    stack_.push_back(n);
    return true;
  }
  bool Close() {
    stack_.pop_back();
    return true;
  }

  std::vector<Node*> stack_;
};

// Appends n's canonical form; false, with `failure`, on a duplicate key.
bool Write(const Node& n, bool top, std::string& out, std::string& failure) {
  if (n.kind == Node::Kind::kScalar) {
    out += n.scalar;
    return true;
  }
  if (n.kind == Node::Kind::kArray) {
    out += '[';
    for (size_t i = 0; i < n.values.size(); ++i) {
      if (i) out += ',';
      if (!Write(n.values[i], false, out, failure)) return false;
    }
    out += ']';
    return true;
  }
  std::vector<size_t> order(n.keys.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return n.keys[a] < n.keys[b]; });
  out += '{';
  bool first = true;
  for (size_t k = 0; k < order.size(); ++k) {
    const std::string& key = n.keys[order[k]];
    if (k > 0 && key == n.keys[order[k - 1]]) {
      failure = fmt::format("the key `{}` appears twice in one object", key);
      return false;
    }
    if (top && key == kMetaDigestField) continue;
    if (!first) out += ',';
    first = false;
    out += json(key).dump();
    out += ':';
    if (!Write(n.values[order[k]], false, out, failure)) return false;
  }
  out += '}';
  return true;
}

}  // namespace

Result<std::string> CanonicalMeta(std::string_view text) {
  Builder b;
  if (!json::sax_parse(text, &b) && b.failure.empty()) b.failure = "not valid JSON";
  if (!b.failure.empty()) return Status::Error(Code::kCorruption, "metadata: {}", b.failure);
  if (b.root.kind != Node::Kind::kObject) return Status::Error(Code::kCorruption, "metadata is not a JSON object");
  std::string out, failure;
  if (!Write(b.root, true, out, failure)) return Status::Error(Code::kCorruption, "metadata: {}", failure);
  return out;
}

Result<std::string> MetaDigest(std::string_view text) {
  GPUSNAP_ASSIGN_OR_RETURN(std::string canonical, CanonicalMeta(text));
  return Sha256Hex(canonical);
}

}  // namespace gpusnap
