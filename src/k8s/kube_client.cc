#include "k8s/kube_client.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <cctype>

#include <httplib.h>

#include "k8s/watch_event.h"
#include "util/files.h"

namespace gpusnap::k8s {

namespace {

using nlohmann::json;

// The CA certificates of `pem` in a store of their own (an SSL context takes
// ownership of the store it is given). nullptr when `pem` holds none.
X509_STORE* StoreOf(const std::string& pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (!bio) return nullptr;
  X509_STORE* store = X509_STORE_new();
  int added = 0;
  while (X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) {
    if (X509_STORE_add_cert(store, cert) == 1) ++added;
    X509_free(cert);
  }
  ERR_clear_error();  // the end of the text reads as an error
  BIO_free(bio);
  if (added == 0) {
    X509_STORE_free(store);
    return nullptr;
  }
  return store;
}

Code CodeForHttp(int status) {
  switch (status) {
    case 404: return Code::kNotFound;
    case 409: return Code::kAlreadyExists;
    case 401:
    case 403: return Code::kFailedPrecondition;
    case 400:
    case 415:
    case 422: return Code::kInvalidArgument;
    default: return Code::kExternal;
  }
}

}  // namespace

std::string QueryEscape(std::string_view value) {
  std::string out;
  for (unsigned char c : value) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

KubeClient::KubeClient(ApiServerConfig config, Endpoint endpoint, int timeout_s)
    : config_(std::move(config)), endpoint_(std::move(endpoint)), timeout_s_(timeout_s) {}

KubeClient::~KubeClient() = default;

Result<std::unique_ptr<KubeClient>> KubeClient::Create(ApiServerConfig config, int timeout_s) {
  const std::string& url = config.server;
  bool https = url.starts_with("https://");
  if (!https && !url.starts_with("http://"))
    return Status::Error(Code::kInvalidArgument, "API server `{}` is not an http(s) URL", url);
  std::string_view rest = std::string_view(url).substr(https ? 8 : 7);
  size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  Endpoint endpoint;
  if (slash != std::string_view::npos) endpoint.path_prefix = std::string(rest.substr(slash));
  while (endpoint.path_prefix.ends_with("/")) endpoint.path_prefix.pop_back();
  if (authority.empty() || authority.find_first_of("?#@ ") != std::string_view::npos)
    return Status::Error(Code::kInvalidArgument, "API server `{}` has no host, or one gpusnap cannot use", url);
  // httplib wants the port spelled out: "[v6]" or "host", then ":port".
  size_t colon = authority.rfind(':');
  bool has_port = colon != std::string_view::npos && authority.find(']', colon) == std::string_view::npos &&
                  (authority.front() != '[' || colon > authority.find(']'));
  endpoint.scheme_host_port = fmt::format("{}://{}{}", https ? "https" : "http", authority,
                                          has_port ? "" : (https ? ":443" : ":80"));
  if (https) {
    if (config.ca_pem.empty())
      return Status::Error(Code::kInvalidArgument, "API server `{}`: no CA certificate to verify it with", url);
    X509_STORE* probe = StoreOf(config.ca_pem);
    if (!probe)
      return Status::Error(Code::kInvalidArgument, "API server `{}`: the CA{} holds no PEM certificate", url,
                           config.ca_file.empty() ? "" : fmt::format(" `{}`", config.ca_file));
    X509_STORE_free(probe);
  }
  return std::unique_ptr<KubeClient>(new KubeClient(std::move(config), std::move(endpoint), timeout_s));
}

Result<std::unique_ptr<httplib::Client>> KubeClient::Connect(int read_timeout_s) const {
  auto cli = std::make_unique<httplib::Client>(endpoint_.scheme_host_port);
  if (!cli->is_valid())
    return Status::Error(Code::kInvalidArgument, "API server `{}` is not a URL httplib takes", config_.server);
  cli->set_connection_timeout(timeout_s_ < 10 ? timeout_s_ : 10);
  cli->set_read_timeout(read_timeout_s);
  cli->set_write_timeout(timeout_s_);
  cli->set_url_encode(false);  // paths come escaped (QueryEscape)
  cli->set_keep_alive(false);
  if (config_.server.starts_with("https://")) {
    cli->enable_server_certificate_verification(true);
    // Only the configured CA: a directory lookup that finds nothing takes
    // the place of the system's default CAs, which httplib would add.
    cli->set_ca_cert_path("", "/nonexistent/gpusnap-kube-ca-only");
    cli->set_ca_cert_store(StoreOf(config_.ca_pem));
  }
  std::string token = config_.token;
  if (token.empty() && !config_.token_file.empty()) {
    auto read = ReadFile(config_.token_file);
    if (!read.ok()) return read.status().Wrap("reading the API server token");
    token = *read;
    while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) token.pop_back();
  }
  if (!token.empty()) cli->set_bearer_token_auth(token);
  return cli;
}

Result<json> KubeClient::Send(const char* method, const std::string& path, const std::string& body,
                              const char* content_type) const {
  GPUSNAP_ASSIGN_OR_RETURN(auto cli, Connect(timeout_s_));
  const std::string full = endpoint_.path_prefix + path;
  httplib::Headers headers = {{"Accept", "application/json"}};
  std::string m = method;
  httplib::Result r = m == "GET"    ? cli->Get(full, headers)
                      : m == "POST" ? cli->Post(full, headers, body, content_type)
                                    : cli->Patch(full, headers, body, content_type);
  if (!r) {
    std::string why = httplib::to_string(r.error());
    if (r.error() == httplib::Error::SSLServerVerification)
      why += fmt::format(" (the certificate does not verify against the CA: {})",
                         X509_verify_cert_error_string(cli->get_openssl_verify_result()));
    return Status::Error(Code::kIoError, "{} {}{}: {}", method, config_.server, path, why);
  }
  if (r->status < 200 || r->status > 299)
    return Status::Error(CodeForHttp(r->status), "{} {}: HTTP {}: {}", method, path, r->status,
                         StatusMessage(r->body));
  json j = json::parse(r->body, nullptr, false);
  if (j.is_discarded())
    return Status::Error(Code::kExternal, "{} {}: the answer is not JSON: `{}`", method, path, r->body.substr(0, 200));
  return j;
}

Result<json> KubeClient::Get(const std::string& path) const { return Send("GET", path, "", nullptr); }

Result<json> KubeClient::Post(const std::string& path, const json& body) const {
  return Send("POST", path, body.dump(), "application/json");
}

Result<json> KubeClient::MergePatch(const std::string& path, const json& patch) const {
  return Send("PATCH", path, patch.dump(), "application/merge-patch+json");
}

Result<KubeClient::WatchEnd> KubeClient::Watch(const std::string& path, int read_timeout_s,
                                               const std::function<bool(std::string_view)>& on_line) {
  GPUSNAP_ASSIGN_OR_RETURN(auto cli, Connect(read_timeout_s));
  {
    MutexLock lock(watch_mu_);
    if (stopped_) return WatchEnd::kStopped;
    watching_ = cli.get();
  }
  int status = 0;
  std::string error_body, partial;
  bool asked_to_stop = false;
  const std::string full = endpoint_.path_prefix + path;
  httplib::Result r = cli->Get(
      full, {{"Accept", "application/json"}},
      [&status](const httplib::Response& res) {
        status = res.status;
        return true;
      },
      [&](const char* data, size_t size) {
        if (stopped_) return false;
        if (status != 200) {
          if (error_body.size() < 4096) error_body.append(data, size);
          return true;
        }
        partial.append(data, size);
        size_t start = 0;
        for (size_t eol; (eol = partial.find('\n', start)) != std::string::npos; start = eol + 1) {
          if (eol > start && !on_line(std::string_view(partial).substr(start, eol - start))) {
            asked_to_stop = true;
            return false;
          }
        }
        partial.erase(0, start);
        return true;
      });
  {
    MutexLock lock(watch_mu_);
    watching_ = nullptr;
  }
  if (stopped_ || asked_to_stop) return WatchEnd::kStopped;
  if (!r) return Status::Error(Code::kIoError, "watch {}{}: {}", config_.server, path, httplib::to_string(r.error()));
  if (status == 410) return WatchEnd::kExpired;
  if (status != 200)
    return Status::Error(CodeForHttp(status), "watch {}: HTTP {}: {}", path, status, StatusMessage(error_body));
  if (!partial.empty() && !on_line(partial)) return WatchEnd::kStopped;
  return WatchEnd::kClosed;
}

void KubeClient::Stop() {
  MutexLock lock(watch_mu_);
  stopped_ = true;
  if (watching_) watching_->stop();
}

}  // namespace gpusnap::k8s
