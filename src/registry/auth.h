// Registry authentication as the ecosystem does it: credentials from a
// docker-style config.json, and the challenge a registry answers with
// (`WWW-Authenticate`: Basic, or Bearer with the token service to ask).
//
// Credentials are secrets: they are never formatted into a message; errors
// name the file and the host, never what the file holds.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "gpusnap/status.h"

namespace gpusnap::registry {

struct Credentials {
  std::string username;
  std::string password;
  std::string identity_token;  // an OAuth2 refresh token, used instead of the password at the token service
};

// The config.json to read: `flag` if given, else $DOCKER_CONFIG/config.json,
// else $HOME/.docker/config.json. Empty when none is named and none exists.
std::string DockerConfigPath(const std::string& flag);

// Pure. The credentials config.json `json` holds for `host` (its `auths`
// keys may carry a scheme and a path: "https://host:5000/v1/"). nullopt when
// the host has none. kInvalidArgument naming `source` (never the content) for
// JSON that does not parse or an `auth` that is not base64 of user:password.
Result<std::optional<Credentials>> CredentialsFor(std::string_view json, std::string_view host,
                                                  std::string_view source);

// Reads `path` (empty: no credentials) and calls CredentialsFor.
Result<std::optional<Credentials>> LoadCredentials(const std::string& path, std::string_view host);

// What a registry asks for in a 401's WWW-Authenticate.
struct Challenge {
  std::string scheme;  // "basic" or "bearer", lower case
  std::map<std::string, std::string> params;  // realm, service, scope, error, ... (keys lower case)
};

// Pure. The first challenge of a WWW-Authenticate value; kInvalidArgument
// when it does not parse.
Result<Challenge> ParseChallenge(std::string_view header);

// Pure. base64 (standard alphabet, padded), and back (nullopt if not base64).
std::string Base64Encode(std::string_view bytes);
std::optional<std::string> Base64Decode(std::string_view text);

}  // namespace gpusnap::registry
