// Which registry manifests a snapshot of the store is known to be:
// <root>/origins/<id>, one manifest digest a line, written by the pull that
// published it (the digest it pulled, every file checked against it) and
// by each push of it (the digest pushed). A pull takes a snapshot already in
// the store as the one it names only when that manifest's digest is here;
// equal metadata alone does not say the files are the artifact's.
#pragma once

#include <string>

#include "gpusnap/status.h"

namespace gpusnap {

std::string OriginsPath(const std::string& root, const std::string& id);

// Whether `id` is known to be the manifest `digest` ("sha256:...").
bool IsOrigin(const std::string& root, const std::string& id, const std::string& digest);

// `id` is the manifest `digest` as well (a push of it).
Status AddOrigin(const std::string& root, const std::string& id, const std::string& digest);

// `id` is the manifest `digest` and no other (a pull about to publish it
// anew), replaced at once.
Status SetOrigin(const std::string& root, const std::string& id, const std::string& digest);

}  // namespace gpusnap
