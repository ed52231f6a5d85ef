#include "store/registry_reference.h"

#include <fmt/format.h>

#include <regex>

namespace gpusnap {

namespace {

// The distribution spec's grammar, anchored.
const std::regex& ComponentPattern() {
  static const std::regex re("[a-z0-9]+((\\.|_|__|-+)[a-z0-9]+)*");
  return re;
}
const std::regex& TagPattern() {
  static const std::regex re("[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}");
  return re;
}
const std::regex& DigestPattern() {
  static const std::regex re("sha256:[a-f0-9]{64}");
  return re;
}
const std::regex& HostPattern() {
  // A DNS name or IPv4 address, or a bracketed IPv6 address, and a port.
  static const std::regex re(
      "(([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])(\\.([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9]))*"
      "|\\[[0-9A-Fa-f:.]+\\])(:[0-9]{1,5})?");
  return re;
}

Status Invalid(std::string_view text, std::string_view why) {
  return Status::Error(Code::kInvalidArgument, "invalid registry reference `{}`: {} (expected "
                       "host[:port]/repository[:tag|@sha256:<digest>])", text, why);
}

}  // namespace

std::string RegistryReference::ToString() const {
  std::string s = host + "/" + repository;
  if (!digest.empty()) return s + "@" + digest;
  return s + ":" + tag;
}

bool LooksLikeRegistryReference(std::string_view text) { return text.find('/') != std::string_view::npos; }

Result<RegistryReference> ParseRegistryReference(std::string_view text) {
  if (text.empty()) return Invalid(text, "it is empty");
  if (text.size() > 1024) return Invalid(text.substr(0, 64), "it is longer than 1024 characters");
  for (char c : text)
    if (static_cast<unsigned char>(c) <= ' ' || static_cast<unsigned char>(c) >= 0x7f)
      return Invalid(text, "it holds a space, a control or a non-ASCII character");
  if (text.find("://") != std::string_view::npos) return Invalid(text, "no scheme: --plain-http chooses HTTP");
  RegistryReference ref;
  std::string_view rest = text;
  if (auto at = rest.find('@'); at != std::string_view::npos) {
    ref.digest = std::string(rest.substr(at + 1));
    rest = rest.substr(0, at);
    if (!std::regex_match(ref.digest, DigestPattern()))
      return Invalid(text, fmt::format("digest `{}` is not sha256:<64 lower-case hex>", ref.digest));
  }
  auto slash = rest.find('/');
  if (slash == std::string_view::npos) return Invalid(text, "it names no registry host");
  ref.host = std::string(rest.substr(0, slash));
  rest = rest.substr(slash + 1);
  if (!std::regex_match(ref.host, HostPattern())) return Invalid(text, fmt::format("`{}` is not a host[:port]", ref.host));
  if (auto colon = ref.host.rfind(':'); colon != std::string::npos && ref.host.back() != ']') {
    int port = std::stoi(ref.host.substr(colon + 1));
    if (port < 1 || port > 65535) return Invalid(text, fmt::format("port {} is out of range", port));
  }
  // A tag follows the last `:` after the last `/`.
  auto last_slash = rest.rfind('/');
  auto colon = rest.rfind(':');
  if (colon != std::string_view::npos && (last_slash == std::string_view::npos || colon > last_slash)) {
    ref.tag = std::string(rest.substr(colon + 1));
    rest = rest.substr(0, colon);
    if (!std::regex_match(ref.tag, TagPattern()))
      return Invalid(text, fmt::format("tag `{}` is not [A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}", ref.tag));
  }
  if (rest.empty()) return Invalid(text, "it names no repository");
  if (rest.size() > 255) return Invalid(text, "the repository is longer than 255 characters");
  size_t start = 0;
  while (start <= rest.size()) {
    size_t end = rest.find('/', start);
    if (end == std::string_view::npos) end = rest.size();
    std::string component(rest.substr(start, end - start));
    if (component.empty()) return Invalid(text, "the repository has an empty path component");
    if (component == "." || component == "..")
      return Invalid(text, fmt::format("the repository has a `{}` path component", component));
    if (!std::regex_match(component, ComponentPattern()))
      return Invalid(text, fmt::format("repository component `{}` is not lower-case letters and digits "
                                       "joined by `.`, `_`, `__` or dashes", component));
    start = end + 1;
  }
  ref.repository = std::string(rest);
  if (ref.tag.empty() && ref.digest.empty()) ref.tag = "latest";
  return ref;
}

}  // namespace gpusnap
