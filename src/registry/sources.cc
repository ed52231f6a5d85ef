#include "registry/sources.h"

#include <fmt/format.h>

#include "registry/signatures.h"

namespace gpusnap::registry {

struct Sources::Place {
  PullSource source;
  std::unique_ptr<RegistryClient> client;
  std::atomic<bool> passed_over{false};
  std::atomic<bool> served{false};
};

Sources::Sources(std::string named, ProgressFn progress) : named_(std::move(named)), progress_(std::move(progress)) {}

Sources::~Sources() = default;

Result<std::unique_ptr<Sources>> Sources::Open(const Reference& named, std::vector<PullSource> places,
                                               const RegistryAccess& access, ProgressFn progress,
                                               std::unique_ptr<Sources> earlier) {
  std::unique_ptr<Sources> s(new Sources(named.ToString(), std::move(progress)));
  for (PullSource& source : places) {
    ConnectOptions options = ConnectOptionsOf(access);
    options.plain_http = options.plain_http || source.insecure;
    auto place = std::make_unique<Place>();
    if (earlier)
      for (auto& e : earlier->places_)
        if (e->client && e->source.reference.host == source.reference.host && e->source.insecure == source.insecure) {
          place->client = std::move(e->client);
          place->passed_over = e->passed_over.load();  // a host that just failed is not asked again
          place->served = e->served.load();
          break;
        }
    if (!place->client) {
      GPUSNAP_ASSIGN_OR_RETURN(place->client, RegistryClient::Create(source.reference.host, options));
    }
    place->source = std::move(source);
    s->places_.push_back(std::move(place));
  }
  return s;
}

void Sources::Serving(Place& place) {
  if (places_.size() < 2 || place.served.exchange(true) || !progress_) return;
  progress_({fmt::format("pull: {} serves `{}`", place.source.Describe(), named_), 0, 0, false});
}

void Sources::PassOver(Place& place, const Status& why) {
  if (place.passed_over.exchange(true) || !progress_) return;
  progress_({fmt::format("pull: {} failed, passed over: {}", place.source.Describe(), why.message()), 0, 0, false});
}

Status Sources::Named(const Place& place, const Status& st, std::string_view how) const {
  if (places_.size() < 2) return st;
  return st.Wrap(fmt::format("`{}`: {} {}", named_, how, place.source.Describe()));
}

Status Sources::NoneServed(const std::string& what, const std::vector<std::string>& reasons, Code code) const {
  if (reasons.empty())
    return Status::Error(code, "`{}`: no place served {}: every one failed earlier in this pull", named_, what);
  return Status::Error(code, "`{}`: no place served {}: {}", named_, what, fmt::join(reasons, "; "));
}

Result<Manifest> Sources::GetManifest() {
  std::vector<std::string> reasons;
  Code code = Code::kNotFound;
  for (auto& p : places_) {
    if (p->passed_over) continue;
    auto got = p->client->GetManifest(p->source.reference.repository, p->source.reference.ManifestName());
    if (got.ok()) {
      Serving(*p);
      return got;
    }
    // Another manifest than the digest asks for: refused, not passed over.
    if (places_.size() < 2 || got.status().code() == Code::kCorruption) return Named(*p, got.status(), "refusing");
    if (got.status().code() != Code::kNotFound) {
      PassOver(*p, got.status());
      code = got.status().code();
    }
    reasons.push_back(fmt::format("{}: {}", p->source.Describe(), got.status().message()));
  }
  return NoneServed("its manifest", reasons, code);
}

Status Sources::VerifySignatures(const TrustPolicy& policy, const Reference& named, const std::string& digest) {
  if (!NeedsSignatures(*RequirementsFor(policy, named).requirements)) return JudgeSignatures(policy, named, digest, {});
  std::string refusing = fmt::format("refusing `{}` ({}): its signatures", named.ToString(), digest);
  std::vector<FetchedSignature> read;
  std::vector<std::string> reasons;
  Code code = Code::kExternal;
  bool answered = false;
  for (auto& p : places_) {
    if (p->passed_over) continue;
    auto fetched = FetchSignatures(*p->client, p->source.reference.repository, digest);
    if (!fetched.ok()) {
      if (places_.size() < 2) return fetched.status().Wrap(refusing);
      if (fetched.status().code() == Code::kCorruption)
        return fetched.status().Wrap(fmt::format("{} from {}", refusing, p->source.Describe()));
      if (fetched.status().code() != Code::kNotFound) PassOver(*p, fetched.status());
      code = fetched.status().code();
      reasons.push_back(fmt::format("{}: {}", p->source.Describe(), fetched.status().message()));
      continue;
    }
    answered = true;
    if (!fetched->empty() && JudgeSignatures(policy, named, digest, *fetched).ok()) return Status::Ok();
    read.insert(read.end(), fetched->begin(), fetched->end());
  }
  if (!answered) return Status::Error(code, "{}: no place served them: {}", refusing, fmt::join(reasons, "; "));
  return JudgeSignatures(policy, named, digest, read);
}

Result<Sources::Served> Sources::FetchBlob(const Blob& blob, uint64_t offset, const RegistryClient::Sink& sink) {
  std::vector<std::string> reasons;
  Code code = Code::kNotFound;
  for (auto& p : places_) {
    if (p->passed_over) continue;
    bool stopped = false;
    uint64_t arrived = 0;
    auto got = p->client->FetchBlob(p->source.reference.repository, blob, offset, [&](const char* data, size_t n) {
      if (!sink(data, n)) return !(stopped = true);
      arrived += n;
      return true;
    });
    if (got.ok()) {
      Serving(*p);
      return Served{*got, &p->source};
    }
    // What the caller stopped, or what began to arrive, is the pull's to
    // judge: its bytes are the caller's now.
    if (places_.size() < 2 || stopped || arrived > 0) return Named(*p, got.status(), "reading from");
    if (got.status().code() != Code::kNotFound) {
      PassOver(*p, got.status());
      code = got.status().code();
    }
    reasons.push_back(fmt::format("{}: {}", p->source.Describe(), got.status().message()));
  }
  return NoneServed(fmt::format("blob {}", blob.digest), reasons, code);
}

}  // namespace gpusnap::registry
