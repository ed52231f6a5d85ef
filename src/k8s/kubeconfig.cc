#include "k8s/kubeconfig.h"

#include <cstdlib>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "k8s/block_yaml.h"
#include "util/files.h"

namespace gpusnap::k8s {

namespace {

using nlohmann::json;

// A field as text: strings as they are, booleans as "true"/"false"; "" when absent.
std::string Text(const json& obj, const char* key) {
  if (!obj.is_object() || !obj.contains(key)) return "";
  const json& v = obj[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  return v.is_null() ? "" : v.dump();
}

// The `what` (e.g. `cluster`) of the entry named `name` in the list `list`.
Result<json> Named(const json& config, const char* list, const char* what, const std::string& name) {
  const json& entries = config.contains(list) ? config[list] : json();
  if (!entries.is_array() && !entries.is_null())
    return Status::Error(Code::kInvalidArgument, "kubeconfig: `{}` is not a list", list);
  for (const json& e : entries.is_array() ? entries : json::array())
    if (e.is_object() && Text(e, "name") == name) {
      const json& v = e.contains(what) ? e[what] : json();
      if (!v.is_object())
        return Status::Error(Code::kInvalidArgument, "kubeconfig: {} `{}` has no `{}` mapping", list, name, what);
      return v;
    }
  return Status::Error(Code::kInvalidArgument, "kubeconfig: no entry named `{}` in `{}`", name, list);
}

std::string Resolve(const std::string& dir, const std::string& path) {
  if (path.empty() || path.front() == '/' || dir.empty()) return path;
  return (std::filesystem::path(dir) / path).string();
}

int Base64Value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

}  // namespace

Result<std::string> Base64Decode(std::string_view text) {
  while (!text.empty() && text.back() == '=') text.remove_suffix(1);
  std::string out;
  out.reserve(text.size() * 3 / 4);
  uint32_t bits = 0;
  int count = 0;
  for (char c : text) {
    int v = Base64Value(c);
    if (v < 0) return Status::Error(Code::kInvalidArgument, "`{}` is not a base64 character", c);
    bits = (bits << 6) | static_cast<uint32_t>(v);
    if (++count == 4) {
      out += static_cast<char>((bits >> 16) & 0xFF);
      out += static_cast<char>((bits >> 8) & 0xFF);
      out += static_cast<char>(bits & 0xFF);
      bits = 0;
      count = 0;
    }
  }
  if (count == 1) return Status::Error(Code::kInvalidArgument, "base64 text of a length no encoder writes");
  if (count == 2) out += static_cast<char>((bits >> 4) & 0xFF);
  if (count == 3) {
    out += static_cast<char>((bits >> 10) & 0xFF);
    out += static_cast<char>((bits >> 2) & 0xFF);
  }
  return out;
}

Result<ApiServerConfig> ParseKubeconfig(std::string_view text, const std::string& dir, std::string_view context) {
  auto parsed = ParseBlockYaml(text);
  if (!parsed.ok()) return parsed.status().Wrap("kubeconfig");
  const json& config = *parsed;
  if (!config.is_object()) return Status::Error(Code::kInvalidArgument, "kubeconfig: not a mapping");
  std::string context_name = context.empty() ? Text(config, "current-context") : std::string(context);
  if (context_name.empty())
    return Status::Error(Code::kInvalidArgument, "kubeconfig: no current-context, and no context was named");
  GPUSNAP_ASSIGN_OR_RETURN(json ctx, Named(config, "contexts", "context", context_name));
  GPUSNAP_ASSIGN_OR_RETURN(json cluster, Named(config, "clusters", "cluster", Text(ctx, "cluster")));

  ApiServerConfig out;
  out.server = Text(cluster, "server");
  if (!out.server.starts_with("https://") && !out.server.starts_with("http://"))
    return Status::Error(Code::kInvalidArgument, "kubeconfig: cluster `{}` has server `{}`, not an http(s) URL",
                         Text(ctx, "cluster"), out.server);
  for (const char* unsupported : {"proxy-url", "tls-server-name"})
    if (!Text(cluster, unsupported).empty())
      return Status::Error(Code::kInvalidArgument, "kubeconfig: cluster field `{}` is not supported", unsupported);
  if (Text(cluster, "insecure-skip-tls-verify") == "true")
    return Status::Error(Code::kInvalidArgument,
                         "kubeconfig: insecure-skip-tls-verify is refused: the API server's certificate is always "
                         "verified");
  if (std::string data = Text(cluster, "certificate-authority-data"); !data.empty()) {
    auto pem = Base64Decode(data);
    if (!pem.ok()) return pem.status().Wrap("kubeconfig: certificate-authority-data");
    out.ca_pem = *pem;
  } else {
    out.ca_file = Resolve(dir, Text(cluster, "certificate-authority"));
  }
  if (out.server.starts_with("http://") && (!out.ca_pem.empty() || !out.ca_file.empty()))
    return Status::Error(Code::kInvalidArgument, "kubeconfig: server `{}` is plain http but a CA is given",
                         out.server);

  std::string user_name = Text(ctx, "user");
  if (!user_name.empty()) {
    GPUSNAP_ASSIGN_OR_RETURN(json user, Named(config, "users", "user", user_name));
    for (const char* unsupported : {"client-certificate", "client-certificate-data", "client-key",
                                    "client-key-data", "exec", "auth-provider", "username", "password"})
      if (user.contains(unsupported) && !user[unsupported].is_null())
        return Status::Error(Code::kInvalidArgument,
                             "kubeconfig: user `{}` authenticates with `{}`, which is not supported: give it a token "
                             "(token or tokenFile)",
                             user_name, unsupported);
    out.token = Text(user, "token");
    if (out.token.empty()) out.token_file = Resolve(dir, Text(user, "tokenFile"));
  }
  return out;
}

Result<ApiServerConfig> LoadKubeconfig(const std::string& path, std::string_view context) {
  GPUSNAP_ASSIGN_OR_RETURN(auto text, ReadFile(path));
  auto config = ParseKubeconfig(text, std::filesystem::path(path).parent_path().string(), context);
  if (!config.ok()) return config.status().Wrap(fmt::format("reading `{}`", path));
  if (config->ca_pem.empty() && !config->ca_file.empty()) {
    GPUSNAP_ASSIGN_OR_RETURN(config->ca_pem, ReadFile(config->ca_file));
  }
  return config;
}

ApiServerConfig InClusterConfig(std::string_view host, std::string_view port, const std::string& service_account_dir) {
  ApiServerConfig out;
  bool ipv6 = host.find(':') != std::string_view::npos;
  out.server = fmt::format("https://{}{}{}:{}", ipv6 ? "[" : "", host, ipv6 ? "]" : "", port);
  out.ca_file = service_account_dir + "/ca.crt";
  out.token_file = service_account_dir + "/token";
  return out;
}

Result<ApiServerConfig> LoadInClusterConfig() {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (!host || !*host || !port || !*port)
    return Status::Error(Code::kFailedPrecondition,
                         "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set: not in a pod (give "
                         "--kubeconfig)");
  ApiServerConfig config = InClusterConfig(host, port);
  GPUSNAP_ASSIGN_OR_RETURN(config.ca_pem, ReadFile(config.ca_file));
  return config;
}

}  // namespace gpusnap::k8s
