#include "registry/redirect.h"

namespace gpusnap::registry {

namespace {

std::string SchemeOf(const std::string& url) {
  auto colon = url.find("://");
  return colon == std::string::npos ? std::string() : url.substr(0, colon);
}

}  // namespace

Result<std::string> ResolveRedirect(const std::string& request_url, const std::string& location) {
  if (location.empty())
    return Status::Error(Code::kExternal, "a redirect from `{}` names no location", request_url);
  std::string scheme = SchemeOf(request_url);
  size_t path_at = request_url.find('/', scheme.size() + 3);
  std::string origin = path_at == std::string::npos ? request_url : request_url.substr(0, path_at);
  std::string path = path_at == std::string::npos ? "/" : request_url.substr(path_at);
  path = path.substr(0, path.find('?'));
  std::string target;
  if (location.find("://") != std::string::npos && location.find("://") < location.find('/'))
    target = location;
  else if (location.starts_with("//"))
    target = scheme + ":" + location;
  else if (location.starts_with("/"))
    target = origin + location;
  else
    target = origin + path.substr(0, path.rfind('/') + 1) + location;
  std::string to = SchemeOf(target);
  if (to != "http" && to != "https")
    return Status::Error(Code::kNotSupported, "a redirect from `{}` leads to `{}`, which is not HTTP(S)", request_url,
                         target);
  if (scheme == "https" && to == "http")
    return Status::Error(Code::kFailedPrecondition,
                         "a redirect from `{}` leads to `{}`: from HTTPS down to plain HTTP, which gpusnap never follows",
                         request_url, target);
  return target;
}

}  // namespace gpusnap::registry
