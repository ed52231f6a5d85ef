#include "registry/registries_conf.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <map>
#include <set>
#include <toml++/toml.h>

#include "util/files.h"

namespace gpusnap::registry {

namespace {

Status Bad(const std::string& source, const std::string& where, const std::string& why) {
  return Status::Error(Code::kInvalidArgument, "registries.conf `{}`: {}: {}", source, where, why);
}

// What gpusnap leaves alone: short names, which its references never are,
// and credential helpers, where its credentials are a docker config.json.
const std::set<std::string, std::less<>>& IgnoredTopLevel() {
  static const std::set<std::string, std::less<>> keys = {"unqualified-search-registries", "short-name-mode",
                                                          "aliases", "credential-helpers",
                                                          "additional-layer-store-auth-helper"};
  return keys;
}

// host[:port], or host[:port]/path, the path perhaps ending in :tag or @digest.
bool IsNamespace(std::string_view text) {
  if (text.empty()) return false;
  if (text.find('/') == std::string_view::npos)
    return text.find('@') == std::string_view::npos && ParseRegistryReference(std::string(text) + "/x").ok();
  return ParseRegistryReference(text).ok();
}

// *.domain: every host under domain.
bool IsWildcard(std::string_view text) { return text.starts_with("*."); }

bool IsValidWildcard(std::string_view text) {
  std::string_view domain = text.substr(2);
  return !domain.empty() && domain.find_first_of(":/@*") == std::string_view::npos &&
         ParseRegistryReference(std::string(domain) + "/x").ok();
}

class TableReader {
 public:
  TableReader(const toml::table& table, std::string source, std::string where)
      : table_(table), source_(std::move(source)), where_(std::move(where)) {}

  Status OnlyKeys(const std::set<std::string, std::less<>>& allowed) const {
    for (const auto& [key, node] : table_)
      if (!allowed.contains(key.str())) return Bad(source_, where_, fmt::format("unknown key `{}`", key.str()));
    return Status::Ok();
  }

  Result<std::string> String(std::string_view key) const {
    const toml::node* n = table_.get(key);
    if (!n) return std::string();
    if (!n->is_string()) return Bad(source_, where_, fmt::format("`{}` must be a string", key));
    return std::string(n->as_string()->get());
  }

  Result<bool> Bool(std::string_view key) const {
    const toml::node* n = table_.get(key);
    if (!n) return false;
    if (!n->is_boolean()) return Bad(source_, where_, fmt::format("`{}` must be true or false", key));
    return n->as_boolean()->get();
  }

  // The tables of `key`: [[key]] or key = [{...}, ...].
  Result<std::vector<const toml::table*>> Tables(std::string_view key) const {
    std::vector<const toml::table*> out;
    const toml::node* n = table_.get(key);
    if (!n) return out;
    const toml::array* a = n->as_array();
    if (!a || !a->is_array_of_tables())
      return Bad(source_, where_, fmt::format("`{}` must be an array of tables ([[{}]])", key, key));
    for (const toml::node& e : *a) out.push_back(e.as_table());
    return out;
  }

  Status Error(const std::string& why) const { return Bad(source_, where_, why); }

 private:
  const toml::table& table_;
  std::string source_;
  std::string where_;
};

Result<MirrorUse> ParseMirrorUse(const std::string& text, const TableReader& r) {
  if (text.empty() || text == "all") return MirrorUse::kAll;
  if (text == "digest-only") return MirrorUse::kDigestOnly;
  if (text == "tag-only") return MirrorUse::kTagOnly;
  return r.Error(fmt::format("`pull-from-mirror` is `{}`, not all, digest-only or tag-only", text));
}

Result<RegistryMirror> ParseMirror(const toml::table& t, const std::string& source, const std::string& where,
                                   bool by_digest_only) {
  TableReader r(t, source, where);
  GPUSNAP_RETURN_IF_ERROR(r.OnlyKeys({"location", "insecure", "pull-from-mirror"}));
  RegistryMirror m;
  GPUSNAP_ASSIGN_OR_RETURN(m.location, r.String("location"));
  if (m.location.empty()) return r.Error("a mirror needs a `location`");
  if (!IsNamespace(m.location))
    return r.Error(fmt::format("`location` `{}` is not host[:port][/namespace...]", m.location));
  GPUSNAP_ASSIGN_OR_RETURN(m.insecure, r.Bool("insecure"));
  GPUSNAP_ASSIGN_OR_RETURN(std::string use, r.String("pull-from-mirror"));
  if (by_digest_only && !use.empty())
    return r.Error("`pull-from-mirror` cannot be set where its [[registry]] sets `mirror-by-digest-only`");
  GPUSNAP_ASSIGN_OR_RETURN(m.use, ParseMirrorUse(use, r));
  if (by_digest_only) m.use = MirrorUse::kDigestOnly;
  return m;
}

Result<RegistryEntry> ParseEntry(const toml::table& t, const std::string& source, size_t index) {
  RegistryEntry e;
  e.line = int(t.source().begin.line);
  std::string where = fmt::format("[[registry]] {} (line {})", index + 1, e.line);
  TableReader r(t, source, where);
  GPUSNAP_RETURN_IF_ERROR(r.OnlyKeys({"prefix", "location", "insecure", "blocked", "mirror-by-digest-only", "mirror"}));
  GPUSNAP_ASSIGN_OR_RETURN(e.prefix, r.String("prefix"));
  GPUSNAP_ASSIGN_OR_RETURN(e.location, r.String("location"));
  if (!e.location.empty() && !IsNamespace(e.location))
    return r.Error(fmt::format("`location` `{}` is not host[:port][/namespace...]", e.location));
  if (e.prefix.empty()) e.prefix = e.location;
  if (e.prefix.empty()) return r.Error("it needs a `prefix` or a `location`");
  if (IsWildcard(e.prefix)) {
    if (!IsValidWildcard(e.prefix))
      return r.Error(fmt::format("`prefix` `{}` is not *.domain (a wildcard names hosts only)", e.prefix));
  } else {
    if (!IsNamespace(e.prefix))
      return r.Error(fmt::format("`prefix` `{}` is not host[:port][/namespace...]", e.prefix));
    if (e.location.empty()) e.location = e.prefix;
  }
  GPUSNAP_ASSIGN_OR_RETURN(e.insecure, r.Bool("insecure"));
  GPUSNAP_ASSIGN_OR_RETURN(e.blocked, r.Bool("blocked"));
  GPUSNAP_ASSIGN_OR_RETURN(bool by_digest_only, r.Bool("mirror-by-digest-only"));
  GPUSNAP_ASSIGN_OR_RETURN(auto mirrors, r.Tables("mirror"));
  for (size_t i = 0; i < mirrors.size(); ++i) {
    std::string at = fmt::format("{}, mirror {} (line {})", where, i + 1, mirrors[i]->source().begin.line);
    GPUSNAP_ASSIGN_OR_RETURN(RegistryMirror m, ParseMirror(*mirrors[i], source, at, by_digest_only));
    e.mirrors.push_back(std::move(m));
  }
  return e;
}

// How much of `named` (a reference as text) `prefix` holds: its length, or
// npos when it holds none of it.
size_t MatchLength(std::string_view prefix, std::string_view named) {
  if (IsWildcard(prefix)) {
    size_t host_end = named.find('/');
    std::string_view host = named.substr(0, host_end);
    if (host.starts_with('[')) return std::string_view::npos;
    std::string_view name = host.substr(0, host.find(':'));
    std::string_view domain = prefix.substr(1);  // ".domain"
    return name.size() > domain.size() && name.ends_with(domain) ? host_end : std::string_view::npos;
  }
  if (!named.starts_with(prefix)) return std::string_view::npos;
  if (named.size() == prefix.size()) return prefix.size();
  char next = named[prefix.size()];
  // After a bare host a `:` begins a port: another registry.
  bool holds = next == '/' || next == '@' || (next == ':' && prefix.find('/') != std::string_view::npos);
  return holds ? prefix.size() : std::string_view::npos;
}

}  // namespace

Result<RegistriesConf> ParseRegistriesConf(std::string_view text, const std::string& source) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    return Bad(source, fmt::format("line {}", e.source().begin.line), std::string(e.description()));
  }
  RegistriesConf conf;
  conf.source = source;
  for (const auto& [key, node] : root) {
    if (key.str() == "registry" || IgnoredTopLevel().contains(key.str())) continue;
    if (key.str() == "registries")
      return Bad(source, "[registries]", "the version 1 format is not read: write [[registry]] tables (version 2)");
    return Bad(source, fmt::format("line {}", node.source().begin.line), fmt::format("unknown key `{}`", key.str()));
  }
  TableReader top(root, source, "the file");
  GPUSNAP_ASSIGN_OR_RETURN(auto entries, top.Tables("registry"));
  std::map<std::string, int> lines_by_prefix;
  for (size_t i = 0; i < entries.size(); ++i) {
    GPUSNAP_ASSIGN_OR_RETURN(RegistryEntry e, ParseEntry(*entries[i], source, i));
    if (auto [it, fresh] = lines_by_prefix.emplace(e.prefix, e.line); !fresh)
      return Bad(source, fmt::format("[[registry]] {} (line {})", i + 1, e.line),
                 fmt::format("prefix `{}` is given already at line {}", e.prefix, it->second));
    conf.registries.push_back(std::move(e));
  }
  return conf;
}

Result<RegistriesConf> LoadRegistriesConf(const std::string& path) {
  std::string file = path;
  std::string why;
  if (file.empty()) {
    if (const char* env = std::getenv(kRegistriesConfEnv); env && *env) {
      file = env;
      why = fmt::format(" (${}; name another with --registries-conf)", kRegistriesConfEnv);
    } else if (::access(kDefaultRegistriesConfPath, F_OK) == 0 || errno != ENOENT) {
      file = kDefaultRegistriesConfPath;
      why = " (the default; name another with --registries-conf)";
    } else {
      return RegistriesConf{};
    }
  }
  auto text = ReadFile(file);
  if (!text.ok()) return text.status().Wrap(fmt::format("registries.conf{}", why));
  auto conf = ParseRegistriesConf(*text, file);
  // A file nobody named for gpusnap says how to go around it.
  if (!conf.ok() && !why.empty()) return Status::Error(conf.status().code(), "{}{}", conf.status().message(), why);
  return conf;
}

std::string PullSource::Describe() const {
  return fmt::format("{}`{}/{}`", mirror ? "mirror " : "", reference.host, reference.repository);
}

Result<std::vector<PullSource>> SourcesFor(const RegistriesConf& conf, const Reference& named) {
  const std::string text = named.ToString();
  const RegistryEntry* entry = nullptr;
  size_t matched = 0;
  for (const RegistryEntry& e : conf.registries) {
    size_t n = MatchLength(e.prefix, text);
    if (n != std::string_view::npos && (!entry || e.prefix.size() > entry->prefix.size())) {
      entry = &e;
      matched = n;
    }
  }
  if (!entry) return std::vector<PullSource>{{named, false, false}};
  std::string where = fmt::format("[[registry]] prefix `{}` (line {})", entry->prefix, entry->line);
  if (entry->blocked)
    return Status::Error(Code::kPermissionDenied, "`{}` is blocked by registries.conf `{}`, {}", text, conf.source,
                         where);
  auto rewritten = [&](const std::string& location) -> Result<Reference> {
    if (location.empty()) return named;
    std::string moved = location + text.substr(matched);
    auto ref = ParseRegistryReference(moved);
    if (!ref.ok())
      return Bad(conf.source, where, fmt::format("`{}` moved to `{}` is no reference: {}", text, moved,
                                                 ref.status().message()));
    return ref;
  };
  bool by_digest = !named.digest.empty();
  std::vector<PullSource> out;
  for (const RegistryMirror& m : entry->mirrors) {
    if ((m.use == MirrorUse::kDigestOnly && !by_digest) || (m.use == MirrorUse::kTagOnly && by_digest)) continue;
    GPUSNAP_ASSIGN_OR_RETURN(Reference ref, rewritten(m.location));
    out.push_back({std::move(ref), m.insecure, true});
  }
  GPUSNAP_ASSIGN_OR_RETURN(Reference primary, rewritten(entry->location));
  out.push_back({std::move(primary), entry->insecure, false});
  return out;
}

}  // namespace gpusnap::registry
