#include "registry/client.h"

#include <fmt/format.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include "registry/rate_floor.h"
#include "registry/redirect.h"
#include "store/sha256.h"

namespace gpusnap::registry {

namespace {

constexpr size_t kMaxErrorBody = 64 << 10;
constexpr size_t kMaxManifestBytes = 16 << 20;
constexpr const char* kManifestAccept =
    "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json, "
    "application/vnd.docker.distribution.manifest.v2+json, "
    "application/vnd.docker.distribution.manifest.list.v2+json";

std::string PercentEncode(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') out.push_back(char(c));
    else out += fmt::format("%{:02X}", c);
  }
  return out;
}

// "https://h:1/a?b" -> {"https://h:1", "/a?b"}
std::pair<std::string, std::string> SplitUrl(const std::string& url) {
  auto scheme = url.find("://");
  auto slash = url.find('/', scheme == std::string::npos ? 0 : scheme + 3);
  if (slash == std::string::npos) return {url, "/"};
  return {url.substr(0, slash), url.substr(slash)};
}

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::string Describe(httplib::Error e, const std::string& host) {
  switch (e) {
    case httplib::Error::Connection:
      return fmt::format("registry `{}` is unreachable (connection refused or timed out)", host);
    case httplib::Error::SSLConnection:
      return fmt::format("registry `{}`: the TLS handshake failed (a plain-HTTP registry needs --plain-http)", host);
    case httplib::Error::SSLServerVerification:
      return fmt::format("registry `{}`: its TLS certificate is not trusted (name its CA with --ca-file)", host);
    case httplib::Error::Read:
    case httplib::Error::Write:
      return fmt::format("registry `{}` went away in the middle of a request ({})", host, httplib::to_string(e));
    case httplib::Error::Canceled:
      return fmt::format("a transfer from registry `{}` was stopped", host);
    default:
      return fmt::format("registry `{}`: {}", host, httplib::to_string(e));
  }
}

// A read that waited the whole timeout is a stall, not a hang-up.
Status Failed(httplib::Error e, const std::string& host, double waited_s, int timeout_s, const std::string& what) {
  if (e == httplib::Error::Read && waited_s >= timeout_s - 0.5)
    return Status::Error(Code::kExternal,
                         "registry `{}` stalled: nothing arrived for {} s on {} (--registry-timeout sets how long "
                         "gpusnap waits)", host, timeout_s, what);
  return Status::Error(Code::kExternal, "{}", Describe(e, host));
}

// What a GET brought: a 2xx body went to the sink (if any); any other body
// is here, cut at kMaxErrorBody.
struct GetAnswer {
  int status = 0;
  httplib::Headers headers;
  std::string body;
  bool reusable = true;  // the body was read to its end: the connection may serve another request
};

// A GET whose every way to hold the caller is bounded: an error body (read
// up to kMaxErrorBody, never further), a body without a sink (up to
// kMaxManifestBytes, the size named when it is more), a 2xx body into the
// sink (at least `min_rate` bytes/s over each `timeout_s`), the wait for a
// byte (a stall, after `timeout_s`).
Result<GetAnswer> BoundedGet(httplib::Client& cli, const std::string& host, const std::string& path,
                             const httplib::Headers& headers, const std::function<bool(const char*, size_t)>* sink,
                             int timeout_s, uint64_t min_rate) {
  GetAnswer out;
  bool to_sink = false, error_body_cut = false, too_large = false, too_slow = false;
  uint64_t declared = 0;
  auto start = std::chrono::steady_clock::now();
  RateFloor floor(min_rate, timeout_s);
  auto r = cli.Get(
      path, headers,
      [&](const httplib::Response& head) {
        out.status = head.status;
        out.headers = head.headers;
        to_sink = sink && head.status >= 200 && head.status < 300;
        if (!to_sink && !sink && head.status >= 200 && head.status < 300 && head.has_header("Content-Length")) {
          declared = std::strtoull(head.get_header_value("Content-Length").c_str(), nullptr, 10);
          if (declared > kMaxManifestBytes) return !(too_large = true);
        }
        return true;
      },
      [&](const char* data, size_t n) {
        if (to_sink) {
          if (!floor.Arrived(n, SecondsSince(start))) return !(too_slow = true);
          return (*sink)(data, n);
        }
        bool is_error = out.status < 200 || out.status >= 300;
        size_t limit = is_error ? kMaxErrorBody : kMaxManifestBytes;
        if (out.body.size() + n > limit) {
          out.body.append(data, limit - out.body.size());
          if (is_error) return !(error_body_cut = true);
          return !(too_large = true);
        }
        out.body.append(data, n);
        return true;
      });
  if (too_large) {
    std::string size = declared > kMaxManifestBytes ? fmt::format("{} bytes", declared) : "a body that goes on past it";
    return Status::Error(Code::kExternal, "registry `{}` answered `{}` with {}: over the 16 MiB limit on a manifest",
                         host, path, size);
  }
  if (too_slow)
    return Status::Error(Code::kExternal,
                         "registry `{}` sent `{}` slower than {} bytes/s over {} s (--registry-min-rate, over each "
                         "--registry-timeout); stopped", host, path, min_rate, timeout_s);
  if (error_body_cut) {
    out.reusable = false;
    return out;
  }
  if (!r) return Failed(r.error(), host, SecondsSince(start), timeout_s, fmt::format("GET `{}`", path));
  return out;
}

}  // namespace

ConnectOptions ConnectOptionsOf(const RegistryAccess& access) {
  return {access.credentials_file, access.ca_file, access.plain_http, access.timeout_s, access.min_rate};
}

std::string PullScope(const std::string& repo) { return "repository:" + repo + ":pull"; }
std::string PushScope(const std::string& repo) { return "repository:" + repo + ":pull,push"; }

struct RegistryClient::Request {
  Request(std::string m, std::string p, std::string s = "") : method(std::move(m)), path(std::move(p)), scope(std::move(s)) {}
  std::string method;
  std::string path;   // "/v2/...", query included, already escaped
  std::string scope;  // for a Bearer token
  httplib::Headers headers;
  std::string body;
  std::string content_type;
  uint64_t upload_size = 0;
  const Reader* reader = nullptr;
  const std::function<void(uint64_t)>* sent = nullptr;
  const Sink* sink = nullptr;  // a 2xx GET body goes here instead of Response::body
};

struct RegistryClient::Response {
  int status = 0;
  httplib::Headers headers;
  std::string body;
  std::string Header(const char* name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
};

RegistryClient::RegistryClient(std::string host, ConnectOptions options, std::optional<Credentials> credentials,
                               std::string credentials_source)
    : host_(std::move(host)),
      base_((options.plain_http ? "http://" : "https://") + host_),
      options_(std::move(options)),
      credentials_(std::move(credentials)),
      credentials_source_(std::move(credentials_source)) {}

RegistryClient::~RegistryClient() = default;

Result<std::unique_ptr<RegistryClient>> RegistryClient::Create(const std::string& host, const ConnectOptions& options) {
  if (!options.ca_file.empty() && ::access(options.ca_file.c_str(), R_OK) != 0)
    return Status::Errno(errno, "CA file `{}`", options.ca_file);
  std::string source = DockerConfigPath(options.credentials_file);
  GPUSNAP_ASSIGN_OR_RETURN(auto credentials, LoadCredentials(source, host));
  return std::unique_ptr<RegistryClient>(new RegistryClient(host, options, std::move(credentials), source));
}

Result<std::unique_ptr<httplib::Client>> RegistryClient::Connection(const std::string& scheme_host_port) {
  if (scheme_host_port == base_) {
    MutexLock lock(mu_);
    if (!idle_.empty()) {
      auto c = std::move(idle_.back());
      idle_.pop_back();
      return c;
    }
  }
  return NewConnection(scheme_host_port);
}

Result<std::unique_ptr<httplib::Client>> RegistryClient::NewConnection(const std::string& scheme_host_port) const {
  auto c = std::make_unique<httplib::Client>(scheme_host_port);
  if (!c->is_valid()) return Status::Error(Code::kInvalidArgument, "`{}` is not a URL httplib takes", scheme_host_port);
  c->set_connection_timeout(10);
  c->set_read_timeout(options_.timeout_s);
  c->set_write_timeout(options_.timeout_s);
  c->set_keep_alive(true);
  c->set_url_encode(false);
  c->set_decompress(false);
  if (scheme_host_port.starts_with("https://")) {
    c->enable_server_certificate_verification(true);
    if (!options_.ca_file.empty()) c->set_ca_cert_path(options_.ca_file);
  }
  return c;
}

void RegistryClient::GiveBack(std::unique_ptr<httplib::Client> c) {
  MutexLock lock(mu_);
  if (idle_.size() < 16) idle_.push_back(std::move(c));
}

Result<std::string> RegistryClient::FetchToken(const Challenge& challenge, const std::string& scope) {
  const std::string& realm = challenge.params.at("realm");
  if (!realm.starts_with("https://") && !(realm.starts_with("http://") && options_.plain_http))
    return Status::Error(Code::kFailedPrecondition,
                         "registry `{}` names token service `{}`, which is not HTTPS (credentials go there only "
                         "over TLS, or with --plain-http)", host_, realm);
  auto split = SplitUrl(realm);  // not a structured binding: the lambda below captures it
  const std::string& origin = split.first;
  const std::string& path = split.second;
  std::string query;
  auto add = [&query](const char* k, const std::string& v) {
    query += (query.empty() ? "" : "&") + std::string(k) + "=" + PercentEncode(v);
  };
  if (auto s = challenge.params.find("service"); s != challenge.params.end()) add("service", s->second);
  for (size_t start = 0; start < scope.size();) {  // one parameter per scope, as the token spec has it
    size_t end = std::min(scope.find(' ', start), scope.size());
    add("scope", scope.substr(start, end - start));
    start = end + 1;
  }
  // Not from the pool, whose lock the caller holds (the realm may be the registry's own host).
  GPUSNAP_ASSIGN_OR_RETURN(auto cli, NewConnection(origin));
  httplib::Result r = [&]() -> httplib::Result {
    if (credentials_ && !credentials_->identity_token.empty()) {
      std::string form = query + "&grant_type=refresh_token&client_id=gpusnap&refresh_token=" +
                         PercentEncode(credentials_->identity_token);
      return cli->Post(path, form, "application/x-www-form-urlencoded");
    }
    if (credentials_) cli->set_basic_auth(credentials_->username, credentials_->password);
    return cli->Get(path + (path.find('?') == std::string::npos ? "?" : "&") + query);
  }();
  if (!r) return Status::Error(Code::kExternal, "token service `{}`: {}", realm, Describe(r.error(), origin));
  if (r->status == 401 || r->status == 403)
    return Status::Error(Code::kFailedPrecondition, "registry `{}`: the token service refused {} (HTTP {})", host_,
                         credentials_ ? fmt::format("the credentials from `{}`", credentials_source_)
                                      : std::string("an anonymous request: no credentials for it were found"),
                         r->status);
  if (r->status != 200)
    return Status::Error(Code::kExternal, "registry `{}`: the token service answered HTTP {}", host_, r->status);
  auto j = nlohmann::json::parse(r->body, nullptr, false);
  std::string token;
  if (j.is_object()) {
    if (j.contains("token") && j["token"].is_string()) token = j["token"];
    else if (j.contains("access_token") && j["access_token"].is_string()) token = j["access_token"];
  }
  if (token.empty()) return Status::Error(Code::kExternal, "registry `{}`: the token service gave no token", host_);
  return "Bearer " + token;
}

Result<std::string> RegistryClient::Authorization(const std::string& scope, bool refresh) {
  MutexLock lock(mu_);
  if (!challenge_) return std::string();
  if (challenge_->scheme == "basic") {
    if (!credentials_ || credentials_->username.empty())
      return Status::Error(Code::kFailedPrecondition, "registry `{}` asks for credentials, and {} has none for it",
                           host_, credentials_source_.empty() ? std::string("no config.json (--registry-config, "
                                                                           "$DOCKER_CONFIG, ~/.docker/config.json)")
                                                              : fmt::format("`{}`", credentials_source_));
    return "Basic " + Base64Encode(credentials_->username + ":" + credentials_->password);
  }
  if (challenge_->scheme != "bearer")
    return Status::Error(Code::kNotSupported, "registry `{}` asks for `{}` authentication, which gpusnap does not speak",
                         host_, challenge_->scheme);
  if (!refresh)
    if (auto it = tokens_.find(scope); it != tokens_.end()) return it->second;
  GPUSNAP_ASSIGN_OR_RETURN(std::string token, FetchToken(*challenge_, scope));
  tokens_[scope] = token;
  return token;
}

Result<RegistryClient::Response> RegistryClient::Send(const Request& req) {
  for (int attempt = 0;; ++attempt) {
    GPUSNAP_ASSIGN_OR_RETURN(std::string auth, Authorization(req.scope, attempt > 0));
    GPUSNAP_ASSIGN_OR_RETURN(auto cli, Connection(base_));
    httplib::Headers headers = req.headers;
    if (!auth.empty()) headers.emplace("Authorization", auth);
    Response out;
    if (req.method == "GET") {
      auto got = BoundedGet(*cli, host_, req.path, headers, req.sink, options_.timeout_s, options_.min_rate);
      if (!got.ok()) return got.status();
      out.status = got->status;
      out.headers = std::move(got->headers);
      out.body = std::move(got->body);
      if (got->reusable) GiveBack(std::move(cli));
    } else {
      auto started = std::chrono::steady_clock::now();
      httplib::Result r = [&]() -> httplib::Result {
    if (req.method == "HEAD") {
      return cli->Head(req.path, headers);
    } else if (req.method == "DELETE") {
      return cli->Delete(req.path, headers);
    } else if (req.reader) {
      const Reader& read = *req.reader;
      auto provider = [&read, &req](size_t offset, size_t length, httplib::DataSink& sink) {
        std::vector<char> buf(std::min<size_t>(length, 1 << 20));
        if (!read(offset, buf.data(), buf.size())) return false;
        if (!sink.write(buf.data(), buf.size())) return false;
        if (req.sent && *req.sent) (*req.sent)(buf.size());
        return true;
      };
      return req.method == "PUT" ? cli->Put(req.path, headers, req.upload_size, provider, req.content_type)
                              : cli->Post(req.path, headers, req.upload_size, provider, req.content_type);
    } else {
      return req.method == "PUT" ? cli->Put(req.path, headers, req.body, req.content_type)
                              : cli->Post(req.path, headers, req.body, req.content_type);
    }
    }();
      if (!r)
        return Failed(r.error(), host_, SecondsSince(started), options_.timeout_s,
                      fmt::format("{} `{}`", req.method, req.path));
      out.status = r->status;
      out.headers = r->headers;
      out.body = r->body.substr(0, kMaxErrorBody);
      GiveBack(std::move(cli));
    }
    if (out.status == 401 && attempt == 0) {
      std::string header = out.Header("WWW-Authenticate");
      if (header.empty())
        return Status::Error(Code::kExternal, "registry `{}` answered 401 without a WWW-Authenticate", host_);
      GPUSNAP_ASSIGN_OR_RETURN(Challenge c, ParseChallenge(header));
      MutexLock lock(mu_);
      challenge_ = std::move(c);
      continue;
    }
    if (out.status == 401)
      return Status::Error(Code::kFailedPrecondition, "registry `{}` refused {} for `{}`", host_,
                           credentials_ ? fmt::format("the credentials from `{}`", credentials_source_)
                                        : std::string("access without credentials"),
                           req.scope.empty() ? "/v2/" : req.scope);
    return out;
  }
}

std::string RegistryClient::ErrorOf(const Response& r, const std::string& what) const {
  std::string detail;
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (j.is_object() && j.contains("errors") && j["errors"].is_array() && !j["errors"].empty()) {
    const auto& e = j["errors"][0];
    if (e.is_object())
      detail = fmt::format(": {} {}", e.value("code", std::string()), e.value("message", std::string()));
  }
  return fmt::format("registry `{}`: {}: HTTP {}{}", host_, what, r.status, detail);
}

Status RegistryClient::Ping() {
  GPUSNAP_ASSIGN_OR_RETURN(Response r, Send(Request("GET", "/v2/")));
  if (r.status == 200) return Status::Ok();
  return Status::Error(Code::kExternal, "{}", ErrorOf(r, "the API check /v2/"));
}

Result<bool> RegistryClient::HasBlob(const std::string& repo, const Blob& blob) {
  GPUSNAP_ASSIGN_OR_RETURN(Response r, Send(Request("HEAD", fmt::format("/v2/{}/blobs/{}", repo, blob.digest), PushScope(repo))));
  if (r.status == 200) return true;
  if (r.status == 404) return false;
  return Status::Error(Code::kExternal, "{}", ErrorOf(r, fmt::format("checking blob {}", blob.digest)));
}

Result<bool> RegistryClient::MountBlob(const std::string& repo, const std::string& from_repo, const Blob& blob) {
  GPUSNAP_ASSIGN_OR_RETURN(
      Response r, Send(Request("POST",
                                fmt::format("/v2/{}/blobs/uploads/?mount={}&from={}", repo, blob.digest, from_repo),
                                PushScope(repo) + " " + PullScope(from_repo))));
  if (r.status == 201) return true;
  if (r.status == 202) return false;  // an upload was started instead: left to expire
  return Status::Error(Code::kExternal, "{}", ErrorOf(r, fmt::format("mounting blob {} from `{}`", blob.digest, from_repo)));
}

Status RegistryClient::UploadBlob(const std::string& repo, const Blob& blob, const Reader& read,
                                  const std::function<void(uint64_t)>& sent) {
  std::string what = fmt::format("uploading blob {}", blob.digest);
  GPUSNAP_ASSIGN_OR_RETURN(Response start, Send(Request("POST", fmt::format("/v2/{}/blobs/uploads/", repo), PushScope(repo))));
  if (start.status != 202) return Status::Error(Code::kExternal, "{}", ErrorOf(start, what));
  std::string location = start.Header("Location");
  if (location.empty()) return Status::Error(Code::kExternal, "registry `{}`: {}: no upload location", host_, what);
  auto [origin, path] = SplitUrl(location);
  if (location.starts_with("http") && origin != base_)
    return Status::Error(Code::kNotSupported, "registry `{}`: {}: it sends the upload to `{}`, another host", host_,
                         what, origin);
  if (!location.starts_with("http")) path = location;
  path += (path.find('?') == std::string::npos ? "?" : "&") + std::string("digest=") + PercentEncode(blob.digest);
  Request put("PUT", path, PushScope(repo));
  put.content_type = "application/octet-stream";
  put.upload_size = blob.size;
  put.reader = &read;
  put.sent = &sent;
  GPUSNAP_ASSIGN_OR_RETURN(Response done, Send(put));
  if (done.status != 201) return Status::Error(Code::kExternal, "{}", ErrorOf(done, what));
  return Status::Ok();
}

Result<uint64_t> RegistryClient::FetchBlob(const std::string& repo, const Blob& blob, uint64_t offset, const Sink& sink) {
  Request req("GET", fmt::format("/v2/{}/blobs/{}", repo, blob.digest), PullScope(repo));
  req.sink = &sink;
  if (offset > 0) req.headers.emplace("Range", fmt::format("bytes={}-", offset));
  GPUSNAP_ASSIGN_OR_RETURN(Response r, Send(req));
  if (r.status == 307 || r.status == 302 || r.status == 303) {
    // Storage elsewhere (a bucket): the URL carries its own authorization;
    // ours is not sent there.
    GPUSNAP_ASSIGN_OR_RETURN(std::string target, ResolveRedirect(base_ + req.path, r.Header("Location")));
    auto [origin, path] = SplitUrl(target);
    GPUSNAP_ASSIGN_OR_RETURN(auto cli, NewConnection(origin));
    httplib::Headers headers;
    if (offset > 0) headers.emplace("Range", fmt::format("bytes={}-", offset));
    auto got = BoundedGet(*cli, origin, path, headers, &sink, options_.timeout_s, options_.min_rate);
    if (!got.ok()) return Status::Error(Code::kExternal, "blob {}: {}", blob.digest, got.status().message());
    r.status = got->status;
    r.body = std::move(got->body);
  }
  if (r.status == 206) return offset;
  if (r.status == 200) return uint64_t{0};
  if (r.status == 404)
    return Status::Error(Code::kNotFound, "registry `{}` has no blob {} in `{}`", host_, blob.digest, repo);
  return Status::Error(Code::kExternal, "{}", ErrorOf(r, fmt::format("fetching blob {}", blob.digest)));
}

Result<std::string> RegistryClient::PutManifest(const std::string& repo, const std::string& name,
                                                const std::string& bytes, const std::string& media_type) {
  Request put("PUT", fmt::format("/v2/{}/manifests/{}", repo, name), PushScope(repo));
  put.body = bytes;
  put.content_type = media_type;
  GPUSNAP_ASSIGN_OR_RETURN(Response r, Send(put));
  if (r.status != 201) return Status::Error(Code::kExternal, "{}", ErrorOf(r, fmt::format("storing manifest `{}`", name)));
  return BlobDigest(Sha256Hex(bytes));
}

Result<Manifest> RegistryClient::GetManifest(const std::string& repo, const std::string& name) {
  Request get("GET", fmt::format("/v2/{}/manifests/{}", repo, name), PullScope(repo));
  get.headers.emplace("Accept", kManifestAccept);
  GPUSNAP_ASSIGN_OR_RETURN(Response r, Send(get));
  if (r.status == 404)
    return Status::Error(Code::kNotFound, "registry `{}` has no `{}` in `{}`", host_, name, repo);
  if (r.status != 200) return Status::Error(Code::kExternal, "{}", ErrorOf(r, fmt::format("fetching manifest `{}`", name)));
  Manifest m{r.body, r.Header("Content-Type"), BlobDigest(Sha256Hex(r.body))};
  if (std::string said = r.Header("Docker-Content-Digest"); !said.empty() && said != m.digest)
    return Status::Error(Code::kCorruption, "registry `{}`: manifest `{}` has digest {}, the registry says {}", host_,
                         name, m.digest, said);
  if (name.starts_with("sha256:") && name != m.digest)
    return Status::Error(Code::kCorruption, "registry `{}`: manifest `{}` arrived with digest {}", host_, name, m.digest);
  return m;
}

}  // namespace gpusnap::registry
