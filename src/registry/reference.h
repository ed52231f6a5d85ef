// The registry layer's names for a snapshot's place in a registry. The syntax
// lives in the store's layer (store/registry_reference.h), where the agent and
// the webhook, which do not link this library, check references too.
#pragma once

#include <string_view>

#include "store/registry_reference.h"

namespace gpusnap::registry {

using Reference = RegistryReference;

inline Result<Reference> ParseReference(std::string_view text) { return ParseRegistryReference(text); }

}  // namespace gpusnap::registry
