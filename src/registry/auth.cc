#include "registry/auth.h"

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "util/files.h"

namespace gpusnap::registry {

namespace {

constexpr const char* kBase64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// "https://host:5000/v2/" -> "host:5000"
std::string HostOfKey(std::string_view key) {
  if (auto scheme = key.find("://"); scheme != std::string_view::npos) key = key.substr(scheme + 3);
  if (auto slash = key.find('/'); slash != std::string_view::npos) key = key.substr(0, slash);
  return std::string(key);
}

bool IsExisting(const std::string& path) { return !path.empty() && ::access(path.c_str(), F_OK) == 0; }

}  // namespace

std::string Base64Encode(std::string_view in) {
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out.push_back(kBase64[(v >> s) & 63]);
  }
  if (i < in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    if (i + 1 < in.size()) v |= uint8_t(in[i + 1]) << 8;
    out.push_back(kBase64[(v >> 18) & 63]);
    out.push_back(kBase64[(v >> 12) & 63]);
    out.push_back(i + 1 < in.size() ? kBase64[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

std::optional<std::string> Base64Decode(std::string_view in) {
  std::string out;
  uint32_t v = 0;
  int bits = 0;
  size_t pad = 0;
  for (char c : in) {
    if (c == '=') {
      ++pad;
      continue;
    }
    if (pad) return std::nullopt;  // data after padding
    const char* p = std::strchr(kBase64, c);
    if (c == 0 || !p) return std::nullopt;
    v = (v << 6) | uint32_t(p - kBase64);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(char((v >> bits) & 0xff));
    }
  }
  if (pad > 2 || (in.size() % 4 != 0 && pad)) return std::nullopt;
  return out;
}

std::string DockerConfigPath(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* dir = std::getenv("DOCKER_CONFIG"); dir && *dir) {
    std::string p = std::string(dir) + "/config.json";
    if (IsExisting(p)) return p;
  }
  if (const char* home = std::getenv("HOME"); home && *home) {
    std::string p = std::string(home) + "/.docker/config.json";
    if (IsExisting(p)) return p;
  }
  return "";
}

Result<std::optional<Credentials>> CredentialsFor(std::string_view text, std::string_view host,
                                                  std::string_view source) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return Status::Error(Code::kInvalidArgument, "credentials file `{}` is not a JSON object", source);
  auto auths = j.find("auths");
  if (auths == j.end()) return std::optional<Credentials>();
  if (!auths->is_object())
    return Status::Error(Code::kInvalidArgument, "credentials file `{}`: `auths` is not an object", source);
  for (const auto& [key, entry] : auths->items()) {
    if (HostOfKey(key) != host) continue;
    if (!entry.is_object())
      return Status::Error(Code::kInvalidArgument, "credentials file `{}`: the entry for `{}` is not an object",
                           source, host);
    Credentials c;
    auto str = [&entry](const char* name) {
      auto it = entry.find(name);
      return it != entry.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    if (std::string auth = str("auth"); !auth.empty()) {
      auto decoded = Base64Decode(auth);
      auto colon = decoded ? decoded->find(':') : std::string::npos;
      if (colon == std::string::npos)
        return Status::Error(Code::kInvalidArgument,
                             "credentials file `{}`: the `auth` of `{}` is not base64 of user:password", source, host);
      c.username = decoded->substr(0, colon);
      c.password = decoded->substr(colon + 1);
    } else {
      c.username = str("username");
      c.password = str("password");
    }
    c.identity_token = str("identitytoken");
    if (c.username.empty() && c.identity_token.empty()) continue;
    return std::optional<Credentials>(std::move(c));
  }
  return std::optional<Credentials>();
}

Result<std::optional<Credentials>> LoadCredentials(const std::string& path, std::string_view host) {
  if (path.empty()) return std::optional<Credentials>();
  auto text = ReadFile(path);
  if (!text.ok()) return text.status().Wrap("reading registry credentials");
  return CredentialsFor(*text, host, path);
}

Result<Challenge> ParseChallenge(std::string_view h) {
  auto bad = [&h](std::string_view why) {
    return Status::Error(Code::kInvalidArgument, "the registry's WWW-Authenticate `{}` does not parse: {}",
                         h.substr(0, 200), why);
  };
  size_t i = 0;
  auto skip_space = [&] {
    while (i < h.size() && (h[i] == ' ' || h[i] == '\t')) ++i;
  };
  skip_space();
  size_t start = i;
  while (i < h.size() && h[i] != ' ') ++i;
  Challenge c;
  for (size_t k = start; k < i; ++k) c.scheme.push_back(char(std::tolower(static_cast<unsigned char>(h[k]))));
  if (c.scheme.empty()) return bad("no scheme");
  while (i < h.size()) {
    skip_space();
    size_t key_start = i;
    while (i < h.size() && h[i] != '=' && h[i] != ',' && h[i] != ' ') ++i;
    std::string key;
    for (size_t k = key_start; k < i; ++k) key.push_back(char(std::tolower(static_cast<unsigned char>(h[k]))));
    skip_space();
    if (i >= h.size() || h[i] != '=') {
      if (!key.empty()) return bad(fmt::format("`{}` has no value", key));
      if (i < h.size() && h[i] == ',') ++i;
      continue;
    }
    ++i;
    skip_space();
    std::string value;
    if (i < h.size() && h[i] == '"') {
      ++i;
      while (i < h.size() && h[i] != '"') {
        if (h[i] == '\\' && i + 1 < h.size()) ++i;
        value.push_back(h[i++]);
      }
      if (i >= h.size()) return bad("an unterminated quoted value");
      ++i;
    } else {
      while (i < h.size() && h[i] != ',' && h[i] != ' ') value.push_back(h[i++]);
    }
    c.params[key] = value;
    skip_space();
    if (i < h.size() && h[i] == ',') ++i;
  }
  if (c.scheme == "bearer" && !c.params.contains("realm")) return bad("a Bearer challenge without a realm");
  return c;
}

}  // namespace gpusnap::registry
