// Where a pull reads from: a containers-registries.conf (version 2, the TOML
// file podman and skopeo read; docs/DISTRIBUTION.md, "Mirrors"), parsed once
// where it enters, and the rule that turns it and a reference into the
// ordered places to try: the mirrors of the [[registry]] whose prefix holds
// the reference, then its primary location.
//
// Where the bytes come from never decides whether they are right: the
// manifest's digest, its signatures and every blob are checked against the
// reference the user named (pull.cc, sources.h), so a mirror serves what the
// primary would, or the pull is refused.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gpusnap/status.h"
#include "registry/reference.h"

namespace gpusnap::registry {

inline constexpr const char* kDefaultRegistriesConfPath = "/etc/containers/registries.conf";
inline constexpr const char* kRegistriesConfEnv = "CONTAINERS_REGISTRIES_CONF";

// When a mirror serves a pull (`pull-from-mirror`).
enum class MirrorUse { kAll, kDigestOnly, kTagOnly };

struct RegistryMirror {
  std::string location;   // host[:port][/namespace...]
  bool insecure = false;  // spoken to in plain HTTP
  MirrorUse use = MirrorUse::kAll;
};

struct RegistryEntry {
  std::string prefix;     // host[:port][/namespace...[/repo[:tag|@digest]]], or *.domain
  std::string location;   // empty: the reference as named (only under a *.domain prefix)
  bool insecure = false;  // the primary location spoken to in plain HTTP
  bool blocked = false;   // a pull of what the prefix holds is refused
  std::vector<RegistryMirror> mirrors;  // tried in this order, before the primary
  int line = 0;           // of its [[registry]], for messages
};

struct RegistriesConf {
  std::string source;  // the file, for messages; empty: none was read
  std::vector<RegistryEntry> registries;
};

// Pure. Reads [[registry]] tables (prefix, location, insecure, blocked,
// mirror-by-digest-only) and their [[registry.mirror]] tables (location,
// insecure, pull-from-mirror). The settings of short names
// (unqualified-search-registries, short-name-mode, [aliases]) and of
// credentials (credential-helpers, additional-layer-store-auth-helper) are
// left alone: gpusnap's references always name their registry, and its
// credentials are a docker config.json. Anything else is refused
// (kInvalidArgument, one line naming `source`, the table's line and the
// key): an unknown key, a value of the wrong type, the version 1 format, a
// prefix or location that is no host[:port][/path], a prefix given twice, a
// mirror without a location.
Result<RegistriesConf> ParseRegistriesConf(std::string_view toml, const std::string& source);

// The configuration of `path`; empty: $CONTAINERS_REGISTRIES_CONF (which
// must exist), else kDefaultRegistriesConfPath if there is one, else none
// (no mirrors).
Result<RegistriesConf> LoadRegistriesConf(const std::string& path);

// One place a pull may read a reference from.
struct PullSource {
  Reference reference;    // the named reference rewritten to the place's location
  bool insecure = false;  // plain HTTP
  bool mirror = false;
  // "mirror `host/repository`" or "`host/repository`", for messages.
  std::string Describe() const;
};

// Pure. Where a pull of `named` reads from, in order: the [[registry]] with
// the longest prefix that holds it (a prefix holds a reference that equals
// it or goes on with `/`, `@`, or, after a repository, `:`; `*.domain`
// holds every host under domain), its mirrors that serve this kind of
// reference (digest-only: a reference by digest; tag-only: by tag), each
// with the part of the reference after the prefix appended to its location,
// then its location (or the reference as named). No [[registry]] holds it:
// the reference alone. kPermissionDenied when the [[registry]] is blocked.
Result<std::vector<PullSource>> SourcesFor(const RegistriesConf& conf, const Reference& named);

}  // namespace gpusnap::registry
