// The part of YAML that kubeconfig files are written in, read into JSON, so
// that the agent can read a kubeconfig without a YAML library.
//
// Understood: block mappings and block sequences nested by indentation
// ("- " items, a mapping item may begin on the dash line, a sequence may sit
// at its key's indentation), plain, 'single-' and "double-quoted" scalars
// (the escapes \" \\ \/ \n \t \r \b \f \0 and \uXXXX), comments, "---" and
// "..." around one document, and the empty flow collections {} and []. A text
// whose first character is "{" is JSON (kubeconfig files may be JSON).
//
// Scalars stay strings: "true", "8443" and "null" are not converted (the
// kubeconfig fields gpusnap reads are all strings); an empty value is null.
//
// Refused with kInvalidArgument naming the line: block scalars (| and >),
// anchors, aliases and tags, flow collections with content, several
// documents, tabs in indentation, duplicate keys, and text that is neither a
// mapping entry nor a sequence item where one is expected.
//
// Pure; thread-safe.
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "gpusnap/status.h"

namespace gpusnap::k8s {

Result<nlohmann::json> ParseBlockYaml(std::string_view text);

}  // namespace gpusnap::k8s
