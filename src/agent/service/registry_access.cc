#include "agent/service/registry_access.h"

#include <fmt/format.h>

#include "agent/api/request.h"
#include "k8s/annotations.h"
#include "k8s/kubeconfig.h"
#include "store/registry_reference.h"
#include "util/files.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace gpusnap::agent {

namespace {

using nlohmann::json;

constexpr std::string_view kDockerConfigJsonType = "kubernetes.io/dockerconfigjson";
constexpr const char* kDockerConfigJsonKey = ".dockerconfigjson";
constexpr const char* kAuthFile = "registry-auth.json";
constexpr std::string_view kOpaqueType = "Opaque";
// A namespace that opts in without credentials pulls and pushes anonymously.
constexpr std::string_view kNoCredentials = R"({"auths":{}})";

std::string SecretType(const json& secret) {
  return secret.contains("type") && secret["type"].is_string() ? secret["type"].get<std::string>() : "";
}

// The Secret's data `.dockerconfigjson` when it is a string, else null.
const json* DockerConfigData(const json& secret) {
  auto data = secret.find("data");
  if (data == secret.end() || !data->is_object()) return nullptr;
  auto config = data->find(kDockerConfigJsonKey);
  return config != data->end() && config->is_string() ? &*config : nullptr;
}

// A `.dockerconfigjson` value: base64 of a JSON object. Errors name the
// Secret, never what it holds.
Result<std::string> DecodeDockerConfig(const json& encoded, std::string_view name) {
  auto bytes = k8s::Base64Decode(encoded.get<std::string>());
  if (!bytes.ok())
    return Status::Error(Code::kInvalidArgument, "{}: its `{}` is not base64", name, kDockerConfigJsonKey);
  json config = json::parse(*bytes, nullptr, false);
  if (!config.is_object())
    return Status::Error(Code::kInvalidArgument, "{}: its `{}` is not a JSON object (a docker config.json)", name,
                         kDockerConfigJsonKey);
  return std::move(bytes).value();
}

// The Secret, read again before each transfer and written where the
// registry client reads credentials.
class SecretCredentials {
 public:
  SecretCredentials(std::shared_ptr<const k8s::KubeClient> kube, std::string namespace_name, std::string name,
                    std::string path, std::function<void(const std::string&)> log)
      : kube_(std::move(kube)),
        namespace_(std::move(namespace_name)),
        name_(std::move(name)),
        path_(std::move(path)),
        log_(std::move(log)) {}

  // The file, refreshed from the Secret. Once a read has succeeded, a later
  // one that fails keeps the file (logged); before that, it is the error.
  Result<std::string> Refresh() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    Status st = Read();
    if (st.ok()) {
      written_ = true;
      return path_;
    }
    if (!written_) return st;
    log_(fmt::format("registry: {}; using the credentials read before", st.ToString()));
    return path_;
  }

  std::string Describe() const { return namespace_ + "/" + name_; }

 private:
  Status Read() REQUIRES(mu_) {
    std::string what = fmt::format("Secret {}/{}", namespace_, name_);
    auto secret = kube_->Get(fmt::format("/api/v1/namespaces/{}/secrets/{}", namespace_, name_));
    if (!secret.ok()) return secret.status().Wrap("reading registry credentials from " + what);
    GPUSNAP_ASSIGN_OR_RETURN(std::string config, DockerConfigOfSecret(*secret, what));
    if (config == last_) return Status::Ok();
    GPUSNAP_RETURN_IF_ERROR(WriteFileAtomic(path_, config, 0600));
    last_ = std::move(config);
    return Status::Ok();
  }

  std::shared_ptr<const k8s::KubeClient> kube_;
  std::string namespace_, name_, path_;
  std::function<void(const std::string&)> log_;
  Mutex mu_;
  bool written_ GUARDED_BY(mu_) = false;
  std::string last_ GUARDED_BY(mu_);
};

// The namespaces' Secrets, each read at each use and written where the
// registry client reads credentials. One lock: two jobs of a namespace write
// its file in turn.
class NamespaceSecrets {
 public:
  NamespaceSecrets(std::shared_ptr<const k8s::KubeClient> kube, std::string dir)
      : kube_(std::move(kube)), dir_(std::move(dir)) {}

  Result<NamespaceCredentials> Read(const std::string& ns) EXCLUDES(mu_) {
    std::string what = fmt::format("Secret {}/{}", ns, kNamespaceSecret);
    auto secret = kube_->Get(fmt::format("/api/v1/namespaces/{}/secrets/{}", ns, kNamespaceSecret));
    if (!secret.ok() && secret.status().code() == Code::kNotFound)
      return Status::Error(Code::kPermissionDenied,
                           "namespace `{}` has not opted in to gpusnap: it has no Secret `{}` (docs/KUBERNETES.md, "
                           "\"A namespace opts in\")",
                           ns, kNamespaceSecret);
    if (!secret.ok()) return secret.status().Wrap("reading " + what);
    NamespaceCredentials out;
    GPUSNAP_ASSIGN_OR_RETURN(out.docker_config, NamespaceDockerConfig(*secret, what));
    GPUSNAP_ASSIGN_OR_RETURN(out.keys, KeysOfSecret(*secret, what));
    out.file = fmt::format("{}/{}.json", dir_, ns);
    MutexLock lock(mu_);
    GPUSNAP_RETURN_IF_ERROR(MakeDirs(dir_, 0700));
    GPUSNAP_RETURN_IF_ERROR(WriteFileAtomic(out.file, out.docker_config, 0600));
    return out;
  }

 private:
  std::shared_ptr<const k8s::KubeClient> kube_;
  std::string dir_;
  Mutex mu_;
};

}  // namespace

Result<std::pair<std::string, std::string>> ParseSecretName(std::string_view text) {
  auto slash = text.find('/');
  std::string ns(text.substr(0, slash)), name(slash == std::string_view::npos ? "" : text.substr(slash + 1));
  if (slash == std::string_view::npos || !IsDns1123Label(ns) || !IsDns1123Subdomain(name))
    return Status::Error(Code::kInvalidArgument,
                         "--registry-secret `{}`: expected NAMESPACE/NAME of a Secret (Kubernetes names)", text);
  return std::pair{ns, name};
}

Result<std::string> DockerConfigOfSecret(const json& secret, std::string_view name) {
  if (!secret.is_object()) return Status::Error(Code::kInvalidArgument, "{} is not an object", name);
  std::string type = SecretType(secret);
  if (type != kDockerConfigJsonType)
    return Status::Error(Code::kInvalidArgument, "{} has type `{}`, not {}", name, type, kDockerConfigJsonType);
  const json* config = DockerConfigData(secret);
  if (config == nullptr) return Status::Error(Code::kInvalidArgument, "{} has no data `{}`", name, kDockerConfigJsonKey);
  return DecodeDockerConfig(*config, name);
}

Result<std::string> NamespaceDockerConfig(const json& secret, std::string_view name) {
  if (!secret.is_object()) return Status::Error(Code::kInvalidArgument, "{} is not an object", name);
  std::string type = SecretType(secret);
  if (type == kDockerConfigJsonType) return DockerConfigOfSecret(secret, name);
  if (type != kOpaqueType)
    return Status::Error(Code::kInvalidArgument, "{} has type `{}`, not {} or {}", name, type, kDockerConfigJsonType,
                         kOpaqueType);
  const json* config = DockerConfigData(secret);
  if (config == nullptr) return std::string(kNoCredentials);
  return DecodeDockerConfig(*config, name);
}

Result<std::string> PushToOfPod(const json& pod) {
  const json* annotations = nullptr;
  if (pod.is_object() && pod.contains("metadata") && pod["metadata"].is_object() &&
      pod["metadata"].contains("annotations") && pod["metadata"]["annotations"].is_object())
    annotations = &pod["metadata"]["annotations"];
  std::string key(k8s::kAnnotationPushTo);
  if (!annotations || !annotations->contains(key)) return std::string();
  const json& value = (*annotations)[key];
  if (!value.is_string()) return Status::Error(Code::kInvalidArgument, "annotation {} is not a string", key);
  std::string reference = value.get<std::string>();
  auto parsed = ParseRegistryReference(reference);
  if (!parsed.ok()) return parsed.status().Wrap(fmt::format("annotation {}", key));
  return reference;
}

Result<std::function<Result<RegistryAccess>()>> MakeRegistryAccess(const RegistrySettings& settings,
                                                                   std::shared_ptr<const k8s::KubeClient> kube,
                                                                   const std::string& run_dir,
                                                                   std::function<void(const std::string&)> log) {
  RegistryAccess access = settings.access;
  if (settings.secret.empty()) return std::function<Result<RegistryAccess>()>([access] { return access; });
  if (!access.credentials_file.empty())
    return Status::Error(Code::kInvalidArgument, "--registry-config and --registry-secret exclude each other");
  GPUSNAP_ASSIGN_OR_RETURN(auto name, ParseSecretName(settings.secret));
  if (!kube) return Status::Error(Code::kInvalidArgument, "--registry-secret needs --kube: the Secret is read through "
                                                          "the Kubernetes API server");
  GPUSNAP_RETURN_IF_ERROR(MakeDirs(run_dir, 0700));
  auto secret = std::make_shared<SecretCredentials>(std::move(kube), name.first, name.second,
                                                    run_dir + "/" + kAuthFile, log);
  GPUSNAP_ASSIGN_OR_RETURN(std::string path, secret->Refresh());
  log(fmt::format("registry: credentials from Secret {}, kept in {}", secret->Describe(), path));
  return std::function<Result<RegistryAccess>()>([access, secret]() -> Result<RegistryAccess> {
    RegistryAccess a = access;
    GPUSNAP_ASSIGN_OR_RETURN(a.credentials_file, secret->Refresh());
    return a;
  });
}

std::function<Result<NamespaceCredentials>(const std::string&)> MakeNamespaceCredentials(
    std::shared_ptr<const k8s::KubeClient> kube, const std::string& run_dir) {
  auto secrets = std::make_shared<NamespaceSecrets>(std::move(kube), run_dir + "/namespaces");
  return [secrets](const std::string& ns) { return secrets->Read(ns); };
}

}  // namespace gpusnap::agent
