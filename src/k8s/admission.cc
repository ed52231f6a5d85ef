#include "k8s/admission.h"

#include <openssl/evp.h>

namespace gpusnap::k8s {

using nlohmann::json;

namespace {

constexpr std::string_view kApiVersion = "admission.k8s.io/v1";

AdmissionReply BadRequest(std::string reason) {
  AdmissionReply r;
  r.http_status = 400;
  r.content_type = "text/plain";
  r.body = "malformed AdmissionReview: " + reason + "\n";
  r.log_line = r.body.substr(0, r.body.size() - 1);
  return r;
}

std::string StringAt(const json& j, const json::json_pointer& p) {
  return j.contains(p) && j[p].is_string() ? j[p].get<std::string>() : "";
}

// "ns/name" as far as known at admission (a CREATE may have only generateName).
std::string PodName(const json& req) {
  std::string ns = StringAt(req, json::json_pointer("/namespace"));
  std::string name = StringAt(req, json::json_pointer("/object/metadata/name"));
  if (name.empty()) name = StringAt(req, json::json_pointer("/name"));
  if (name.empty()) name = StringAt(req, json::json_pointer("/object/metadata/generateName")) + "*";
  return (ns.empty() ? "" : ns + "/") + name;
}

bool IsPodCreate(const json& req) {
  return StringAt(req, json::json_pointer("/kind/kind")) == "Pod" &&
         StringAt(req, json::json_pointer("/kind/group")).empty() &&
         StringAt(req, json::json_pointer("/operation")) == "CREATE" &&
         StringAt(req, json::json_pointer("/subResource")).empty();
}

json Response(const std::string& uid) {
  return {{"apiVersion", kApiVersion}, {"kind", "AdmissionReview"}, {"response", {{"uid", uid}, {"allowed", true}}}};
}

AdmissionReply Reply(const json& review, std::string log_line) {
  AdmissionReply r;
  r.body = review.dump();
  r.log_line = std::move(log_line);
  return r;
}

AdmissionReply MutateRequest(const json& req, const std::string& uid, const MutateConfig& config) {
  std::string who = fmt::format("uid={} pod={}", uid, PodName(req));
  json review = Response(uid);
  if (!IsPodCreate(req)) return Reply(review, who + ": not a pod creation; allowed unchanged");
  auto m = MutatePod(req["object"], config);
  if (!m.ok()) {
    std::string warning = "gpusnap webhook: " + m.status().ToString() + "; pod admitted unchanged";
    review["response"]["warnings"] = json::array({warning});
    return Reply(review, who + ": " + warning);
  }
  json& resp = review["response"];
  if (!m->patch.empty()) {
    resp["patchType"] = "JSONPatch";
    resp["patch"] = Base64Encode(m->patch.dump());
  }
  if (!m->warnings.empty()) resp["warnings"] = m->warnings;
  std::string line = fmt::format("{}: {} ({} ops", who, m->summary, m->patch.size());
  for (const auto& w : m->warnings) line += "; warning: " + w;
  return Reply(review, line + ")");
}

}  // namespace

std::string Base64Encode(std::string_view data) {
  std::string out(4 * ((data.size() + 2) / 3), '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(data.data()), static_cast<int>(data.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

AdmissionReply Admit(std::string_view body, const MutateConfig& config) noexcept {
  std::string uid;
  try {
    json review = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (review.is_discarded()) return BadRequest("body is not JSON");
    if (!review.is_object()) return BadRequest("body is not a JSON object");
    if (review.value("apiVersion", json()) != kApiVersion)
      return BadRequest(fmt::format("apiVersion is not `{}`", kApiVersion));
    if (review.value("kind", json()) != "AdmissionReview") return BadRequest("kind is not `AdmissionReview`");
    auto req = review.find("request");
    if (req == review.end() || !req->is_object()) return BadRequest("no request");
    auto u = req->find("uid");
    if (u == req->end() || !u->is_string() || u->get_ref<const std::string&>().empty())
      return BadRequest("request has no uid");
    uid = u->get<std::string>();
    if (IsPodCreate(*req) && !(req->contains("object") && (*req)["object"].is_object()))
      return BadRequest("pod creation without the pod object");
    return MutateRequest(*req, uid, config);
  } catch (const std::exception& e) {
    // A bug: the pod must still be admitted.
    try {
      std::string warning = fmt::format("gpusnap webhook: internal error: {}; pod admitted unchanged", e.what());
      json review = Response(uid);
      review["response"]["warnings"] = json::array({warning});
      return Reply(review, fmt::format("uid={}: {}", uid, warning));
    } catch (...) {
    }
  } catch (...) {
  }
  AdmissionReply r;
  r.http_status = 500;
  r.content_type = "text/plain";
  r.body = "internal error\n";
  r.log_line = "internal error";
  return r;
}

}  // namespace gpusnap::k8s
