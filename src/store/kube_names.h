// Kubernetes object names, as the API server accepts them: a DNS-1123 label
// (namespaces, containers: 1-63 of [a-z0-9-], alphanumeric at both ends) and
// a DNS-1123 subdomain (pods, Secrets: labels joined by dots, at most 253).
//
// Pure, in the store's layer so that the snapshot's owner (gpusnap.json),
// the agent's requests and the tenancy rules check names by one rule.
#pragma once

#include <string_view>

namespace gpusnap {

bool IsDns1123Label(std::string_view s);
bool IsDns1123Subdomain(std::string_view s);

}  // namespace gpusnap
