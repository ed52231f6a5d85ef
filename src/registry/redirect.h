// Where a registry's redirect leads, and whether gpusnap goes there.
#pragma once

#include <string>

#include "gpusnap/status.h"

namespace gpusnap::registry {

// The absolute URL that `location` (a Location header) names for a request
// to `request_url` (scheme://host[:port]/path): an absolute URL as it is, a
// scheme-relative one (//host/path) under the request's scheme, an
// absolute path on the request's origin, a relative path against the
// request path's directory (RFC 3986, section 5.2, without dot segments).
// Refused: an empty location, a scheme other than http(s), and a step from
// https down to http (what TLS protected would travel in the clear).
Result<std::string> ResolveRedirect(const std::string& request_url, const std::string& location);

}  // namespace gpusnap::registry
