// Small edits of a v1 Pod held as JSON, each one "ensure" style: it changes
// the pod only when the wanted state is not already there, so a mutation
// built from them is idempotent. Used by mutate.cc.
//
// REQUIRES for every function taking a pod or container: the JSON passed
// ValidatePodShape (objects where a Pod has objects, arrays where it has
// arrays); the functions do not re-check and nlohmann-json would throw.
//
// Thread-safety: none needed; plain functions on values the caller owns.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpusnap/status.h"

namespace gpusnap::k8s {

// kInvalidArgument naming the first field whose JSON type is not a Pod's
// (spec.containers[1].env must be an array, ...). Fields gpusnap never reads
// are not checked.
Status ValidatePodShape(const nlohmann::json& pod);

// metadata.annotations[key] / metadata.labels[key] when a string, else "".
std::string Annotation(const nlohmann::json& pod, std::string_view key);
void SetAnnotation(nlohmann::json& pod, std::string_view key, const std::string& value);
void SetLabel(nlohmann::json& pod, std::string_view key, const std::string& value);

// Whether the container asks for a non-zero amount of `resource` in its
// limits or requests ("1", 1, "2"; "0" and 0 are no request).
bool RequestsResource(const nlohmann::json& container, std::string_view resource);

// Sets limits[resource] to `count` and, when requests has the resource too,
// requests[resource] (extended resources require both to be equal).
void SetResourceCount(nlohmann::json& container, std::string_view resource, int count);

// A hostPath volume gpusnap wants. Resolve finds the pod's volume with the
// same hostPath.path (reused under its own name) or picks `name`, or `name`
// with a numeric suffix when a different volume already has that name.
struct HostPathVolume {
  std::string name;
  std::string path;
  std::string type;  // "Directory", "DirectoryOrCreate"
};
HostPathVolume ResolveVolume(const nlohmann::json& pod, HostPathVolume wanted);
// Adds the volume unless a volume of that name is present.
void EnsureVolume(nlohmann::json& pod, const HostPathVolume& volume);

// A volumeMount; `mount` has at least name and mountPath.
enum class MountState {
  kPresent,   // a mount of the same volume at the same path is there
  kFree,      // nothing is mounted at that path
  kConflict,  // another volume is mounted at that path
};
MountState CheckMount(const nlohmann::json& container, const nlohmann::json& mount);
// Appends the mount when CheckMount says kFree.
void EnsureMount(nlohmann::json& container, const nlohmann::json& mount);

// The container's env entry named `name`, or nullptr.
const nlohmann::json* FindEnv(const nlohmann::json& container, std::string_view name);
// Appends `entry` (an env var object) unless a variable of its name exists.
void EnsureEnv(nlohmann::json& container, const nlohmann::json& entry);
// Makes `entry` the one variable of its name: every other definition of it
// goes (the kubelet takes the last of several), `entry` is appended unless
// it is there already.
void SetEnv(nlohmann::json& container, const nlohmann::json& entry);

// Appends `lib` to the container's LD_PRELOAD literal value ("a.so:lib"),
// creating the variable when absent; does nothing when `lib` is already one
// of the entries (separated by ':' or ' ').
// REQUIRES: LD_PRELOAD, if present, does not come from valueFrom.
void AppendPreload(nlohmann::json& container, const std::string& lib);

// Pointers into pod.spec.containers then pod.spec.initContainers. Valid until
// either array is resized.
std::vector<nlohmann::json*> AllContainers(nlohmann::json& pod);

}  // namespace gpusnap::k8s
