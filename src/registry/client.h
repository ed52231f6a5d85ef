// The registry's HTTP API (the OCI distribution spec), over cpp-httplib:
// blobs (HEAD, cross-repository mount, monolithic upload, streamed GET with
// Range), manifests (PUT, GET). Authentication follows the registry's 401:
// Basic with the config.json credentials, or Bearer with a token fetched from
// the realm it names (credentials, if any, sent to the token service only),
// cached per scope. TLS is verified against the system CAs, or only the CA
// file given; plain HTTP only when asked.
//
// Thread-safety: a RegistryClient may be used from many threads at once;
// each call takes a connection of its own from a small pool.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "gpusnap/distribution.h"
#include "gpusnap/status.h"
#include "registry/artifact.h"
#include "registry/auth.h"
#include "registry/reference.h"
#include "util/mutex.h"

namespace httplib {
class Client;
}

namespace gpusnap::registry {

struct ConnectOptions {
  std::string credentials_file;  // docker config.json; empty: DockerConfigPath's default
  std::string ca_file;           // verify TLS against this CA only; empty: the system CAs
  bool plain_http = false;
  int timeout_s = 60;            // per request, between bytes
  uint64_t min_rate = 0;         // bytes/s a blob moves at least, over each timeout_s (RateFloor); 0: no floor
};

// How a RegistryAccess (parsed where it entered) reaches the registry.
ConnectOptions ConnectOptionsOf(const RegistryAccess& access);

struct Manifest {
  std::string bytes;
  std::string media_type;
  std::string digest;  // sha256 of the bytes, checked against the registry's Docker-Content-Digest
};

class RegistryClient {
 public:
  // Reads the credentials for `host` (not sent anywhere yet). Errors: the
  // credentials file's.
  static Result<std::unique_ptr<RegistryClient>> Create(const std::string& host, const ConnectOptions& options);
  ~RegistryClient();

  const std::string& host() const { return host_; }

  // GET /v2/: reachable and, with the credentials, allowed in.
  Status Ping();

  // Whether `repo` has the blob (HEAD).
  Result<bool> HasBlob(const std::string& repo, const Blob& blob);
  // Asks for the blob to be mounted from `from_repo` of the same registry;
  // false when the registry did not (it answers with an upload instead).
  Result<bool> MountBlob(const std::string& repo, const std::string& from_repo, const Blob& blob);
  // Uploads `blob.size` bytes that `read(offset, buffer, n)` supplies (it
  // returns false on a read error, which fails the upload). `sent` counts the
  // bytes as they go.
  using Reader = std::function<bool(uint64_t offset, char* buffer, size_t n)>;
  Status UploadBlob(const std::string& repo, const Blob& blob, const Reader& read,
                    const std::function<void(uint64_t)>& sent = {});

  // Streams a blob from byte `offset` to `sink` (false from the sink stops
  // it). Returns the offset the registry actually started from (0 when it
  // ignored the Range). The caller checks the digest.
  using Sink = std::function<bool(const char* data, size_t n)>;
  Result<uint64_t> FetchBlob(const std::string& repo, const Blob& blob, uint64_t offset, const Sink& sink);

  // PUT the manifest under `name` (a tag); returns its digest.
  Result<std::string> PutManifest(const std::string& repo, const std::string& name, const std::string& bytes,
                                  const std::string& media_type);
  Result<Manifest> GetManifest(const std::string& repo, const std::string& name);

 private:
  struct Request;
  struct Response;
  RegistryClient(std::string host, ConnectOptions options, std::optional<Credentials> credentials,
                 std::string credentials_source);
  Result<Response> Send(const Request& request);
  Result<std::string> Authorization(const std::string& scope, bool refresh) EXCLUDES(mu_);
  Result<std::string> FetchToken(const Challenge& challenge, const std::string& scope) REQUIRES(mu_);
  Result<std::unique_ptr<httplib::Client>> Connection(const std::string& scheme_host_port) EXCLUDES(mu_);
  Result<std::unique_ptr<httplib::Client>> NewConnection(const std::string& scheme_host_port) const;
  void GiveBack(std::unique_ptr<httplib::Client> c) EXCLUDES(mu_);
  std::string ErrorOf(const Response& r, const std::string& what) const;

  std::string host_;
  std::string base_;  // "https://host" or "http://host"
  ConnectOptions options_;
  std::optional<Credentials> credentials_;
  std::string credentials_source_;
  Mutex mu_;
  std::optional<Challenge> challenge_ GUARDED_BY(mu_);  // what /v2/ asked for, once seen
  std::map<std::string, std::string> tokens_ GUARDED_BY(mu_);  // scope -> "Bearer ..." / "Basic ..."
  std::vector<std::unique_ptr<httplib::Client>> idle_ GUARDED_BY(mu_);
};

// The scopes of the token service.
std::string PullScope(const std::string& repo);
std::string PushScope(const std::string& repo);

}  // namespace gpusnap::registry
