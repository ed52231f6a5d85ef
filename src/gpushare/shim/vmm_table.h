// The device memory a gpushare process manages through the driver's VMM calls
// itself (cuMemCreate, cuMemImportFromShareableHandle, cuMemMap, ...), as the
// shim sees it: the physical objects and where each is mapped.
//
// The application never holds a driver handle: it holds an id the shim made
// (IsObjectId), because a release frees the driver's object and a load makes
// a new one, with a new handle, behind the same id. Imported objects are
// another process's memory; they are not saved, and come back by `remap`.
//
// Thread-safety: none; the shim guards it with its own mutex.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace gpusnap::gpushare::shim {

struct AccessGrant {
  int32_t device = 0;
  int32_t flags = 0;  // CUmemAccess_flags

  bool operator==(const AccessGrant&) const = default;
};

struct VmmObject {
  uint64_t id = 0;        // what the application holds
  uint64_t real = 0;      // the driver's handle; 0 while released
  uint64_t size = 0;
  int32_t device = 0;
  bool imported = false;  // another process's memory
  int app_refs = 0;       // cuMemCreate/Import/Retain minus cuMemRelease
  std::array<unsigned char, 32> prop{};  // the CUmemAllocationProp it was created with
  int kept_fd = -1;       // imported: a duplicate of the fd it came as
  uint64_t ipc_range = 0; // opened by cuIpcOpenMemHandle: the range the shim reserved for it
  uint64_t ipc_pointer = 0;  // what cuIpcOpenMemHandle returned (range + offset)
};

struct VmmMapping {
  uint64_t va = 0;
  uint64_t size = 0;
  uint64_t offset = 0;
  uint64_t object = 0;
  uint64_t context = 0;  // current when it was mapped: copies to and from it run there
  std::vector<AccessGrant> access;

  bool operator==(const VmmMapping&) const = default;
};

class VmmTable {
 public:
  static bool IsObjectId(uint64_t handle) { return (handle >> 48) == kIdTag; }

  // Records `o` under a new id and returns it.
  uint64_t AddObject(VmmObject o);
  VmmObject* Find(uint64_t id);
  // Drops the object (when the application released it and nothing maps it).
  void RemoveObject(uint64_t id);
  std::vector<VmmObject*> Objects();

  // False when the range overlaps a mapping or the object is unknown.
  bool AddMapping(const VmmMapping& m);
  // The mappings wholly inside [va, va+size); nullopt when the range cuts one
  // or holds none.
  std::optional<std::vector<VmmMapping>> MappingsIn(uint64_t va, uint64_t size) const;
  void RemoveMapping(uint64_t va);
  // Where `addr` is mapped, and through which object.
  std::optional<VmmMapping> MappingContaining(uint64_t addr) const;
  std::vector<VmmMapping> MappingsOf(uint64_t object) const;
  // The first mapping of the whole object at offset 0: how its bytes are read
  // and written.
  std::optional<VmmMapping> WholeMappingOf(uint64_t object) const;
  // Grants recorded on every mapping inside [va, va+size); false if none.
  bool SetAccess(uint64_t va, uint64_t size, const std::vector<AccessGrant>& grants);

  // Whether the object has neither application references nor mappings left.
  bool Unused(uint64_t id) const;

 private:
  static constexpr uint64_t kIdTag = 0x6753;  // "gS": far above any driver handle seen
  uint64_t next_ = 1;
  std::map<uint64_t, VmmObject> objects_;
  std::map<uint64_t, VmmMapping> mappings_;  // by va
};

}  // namespace gpusnap::gpushare::shim
