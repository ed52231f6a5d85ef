// The places one pull reads from (registries_conf.h's SourcesFor: mirrors in
// order, then the primary), each reached with a client of its own (its
// host's credentials, plain HTTP where `--plain-http` or its `insecure` says
// so). The manifest, its signatures and each blob come from the first place
// that serves them.
//
// A place that cannot be reached or answers with an error is passed over for
// the next and not asked again in this pull; one that lacks what is asked
// (404) is asked for the next thing. A place that serves other bytes than the
// ones asked for (a manifest of another digest, a signature payload that is
// not its digest) is refused at once, and the pull with it; each blob's bytes
// are checked by the caller as they stream, against the digest the manifest
// (which the trust policy judged) gives them. A blob that breaks off after
// its first byte fails the pull as it does without mirrors (the next pull
// goes on from what arrived).
//
// Thread-safe: blobs may be fetched from several threads at once.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gpusnap/distribution.h"
#include "registry/client.h"
#include "registry/registries_conf.h"
#include "registry/trust_policy.h"

namespace gpusnap::registry {

class Sources {
 public:
  // Clients for `places` (none contacted yet); `named` is the reference the
  // user gave, for messages. The clients of `earlier` are taken over where
  // they reach the same host in the same way, with the tokens they hold.
  // Errors: a credentials or CA file's.
  static Result<std::unique_ptr<Sources>> Open(const Reference& named, std::vector<PullSource> places,
                                               const RegistryAccess& access, ProgressFn progress,
                                               std::unique_ptr<Sources> earlier = nullptr);
  ~Sources();

  // The manifest each place's reference names, from the first that has it.
  Result<Manifest> GetManifest();

  // The signatures of `digest` judged by `policy` for `named`, when its scope
  // asks for signatures: read from one place after another until one's are
  // accepted (a mirror may hold an older set); refused by the judgement of
  // every signature read, or, when no place answered, by why.
  Status VerifySignatures(const TrustPolicy& policy, const Reference& named, const std::string& digest);

  struct Served {
    uint64_t from = 0;                  // the offset the place started at (0: it ignored the Range)
    const PullSource* place = nullptr;  // who sent the bytes
  };
  // Streams `blob` from `offset` to `sink` (false from the sink stops it).
  Result<Served> FetchBlob(const Blob& blob, uint64_t offset, const RegistryClient::Sink& sink);

 private:
  struct Place;
  Sources(std::string named, ProgressFn progress);
  // Once per place: the progress says it serves.
  void Serving(Place& place);
  // The place is passed over from now on; the progress says why, once.
  void PassOver(Place& place, const Status& why);
  // The error of a place that failed, naming it (and `how` it failed) when
  // there are others.
  Status Named(const Place& place, const Status& st, std::string_view how) const;
  // What every place said, one line.
  Status NoneServed(const std::string& what, const std::vector<std::string>& reasons, Code code) const;

  std::string named_;
  ProgressFn progress_;
  std::vector<std::unique_ptr<Place>> places_;
};

}  // namespace gpusnap::registry
