// The application's own VMM objects and the memory processes share: what
// NCCL, PyTorch's expandable segments and CUDA IPC do with device memory.
//
// Objects the process created are saved and freed with its cuMemAlloc
// memory on release and made again at the same addresses on load. Objects it
// imported belong to another process: release unmaps and drops them, and
// `remap` maps them again, at the same addresses, from a new fd the exporting
// process gives gpusnap after its own load.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>

#include "gpushare/common/control_client.h"
#include "gpushare/common/protocol.h"
#include "gpushare/shim/control_server.h"
#include "gpushare/shim/device_memory.h"

namespace gpusnap::gpushare::shim {
namespace {

uint64_t CurrentContext() {
  abi::CUcontext ctx = nullptr;
  return Real().ctx_get_current(&ctx) == abi::CUDA_SUCCESS ? reinterpret_cast<uint64_t>(ctx) : 0;
}

abi::CUresult GrantAccess(const VmmMapping& m) {
  if (m.access.empty()) return abi::CUDA_SUCCESS;
  std::vector<abi::CUmemAccessDesc> desc;
  for (const AccessGrant& g : m.access)
    desc.push_back({{abi::CU_MEM_LOCATION_TYPE_DEVICE, g.device}, static_cast<abi::CUmemAccess_flags>(g.flags)});
  return Real().mem_set_access(m.va, m.size, desc.data(), desc.size());
}

// Maps every mapping of an object again with its access.
Status MapMappings(const std::vector<VmmMapping>& mappings, abi::CUmemGenericAllocationHandle real) {
  for (const VmmMapping& m : mappings) {
    abi::CUresult rc = MapAt(m.va, m.size, m.offset, real);
    if (rc == abi::CUDA_SUCCESS) rc = GrantAccess(m);
    if (rc != abi::CUDA_SUCCESS)
      return Real().Error("cuMemMap", rc).Wrap(fmt::format("mapping {:#x} ({} bytes) again", m.va, m.size));
  }
  return Status::Ok();
}

}  // namespace

abi::CUresult DeviceMemory::Create(abi::CUmemGenericAllocationHandle* handle, size_t size,
                                   const abi::CUmemAllocationProp* prop, unsigned long long flags) {
  const RealDriver& d = Real();
  abi::CUmemGenericAllocationHandle real = 0;
  abi::CUresult rc = d.mem_create(&real, size, prop, flags);
  if (rc != abi::CUDA_SUCCESS || handle == nullptr) return rc;
  // Host memory objects stay the driver's: its checkpoint keeps host memory.
  if (prop->location.type != abi::CU_MEM_LOCATION_TYPE_DEVICE) {
    *handle = real;
    return rc;
  }
  VmmObject o;
  o.real = real;
  o.size = size;
  o.device = prop->location.id;
  o.app_refs = 1;
  std::memcpy(o.prop.data(), prop, sizeof(abi::CUmemAllocationProp));
  MutexLock lock(mu_);
  *handle = objects_.AddObject(o);
  return rc;
}

void DeviceMemory::CloseExportedFds(uint64_t object) {
  std::erase_if(exported_fds_, [&](const std::pair<uint64_t, int>& e) {
    if (object != 0 && e.first != object) return false;
    ::close(e.second);
    return true;
  });
}

void DeviceMemory::DropIfUnused(uint64_t id) {
  VmmObject* o = objects_.Find(id);
  if (o == nullptr || !objects_.Unused(id)) return;
  if (o->real != 0) Real().mem_release(o->real);
  if (o->kept_fd >= 0) ::close(o->kept_fd);
  CloseExportedFds(id);
  objects_.RemoveObject(id);
}

abi::CUresult DeviceMemory::ReleaseHandle(abi::CUmemGenericAllocationHandle handle) {
  if (!VmmTable::IsObjectId(handle)) return Real().mem_release(handle);
  MutexLock lock(mu_);
  VmmObject* o = objects_.Find(handle);
  if (o == nullptr || o->app_refs == 0) return abi::CUDA_ERROR_INVALID_VALUE;
  --o->app_refs;
  DropIfUnused(handle);
  return abi::CUDA_SUCCESS;
}

abi::CUresult DeviceMemory::Map(abi::CUdeviceptr va, size_t size, size_t offset,
                                abi::CUmemGenericAllocationHandle handle, unsigned long long flags) {
  const RealDriver& d = Real();
  if (!VmmTable::IsObjectId(handle)) return d.mem_map(va, size, offset, handle, flags);
  MutexLock lock(mu_);
  VmmObject* o = objects_.Find(handle);
  if (o == nullptr || o->real == 0) return abi::CUDA_ERROR_INVALID_VALUE;
  abi::CUresult rc = d.mem_map(va, size, offset, o->real, flags);
  if (rc != abi::CUDA_SUCCESS) return rc;
  if (o->imported) o->size = std::max<uint64_t>(o->size, offset + size);
  objects_.AddMapping({va, size, offset, handle, CurrentContext(), {}});
  return rc;
}

abi::CUresult DeviceMemory::Unmap(abi::CUdeviceptr va, size_t size) {
  const RealDriver& d = Real();
  abi::CUresult rc = d.mem_unmap(va, size);
  if (rc != abi::CUDA_SUCCESS) return rc;
  MutexLock lock(mu_);
  auto in = objects_.MappingsIn(va, size);
  if (!in) return rc;
  for (const VmmMapping& m : *in) {
    objects_.RemoveMapping(m.va);
    DropIfUnused(m.object);
  }
  return rc;
}

abi::CUresult DeviceMemory::SetAccess(abi::CUdeviceptr va, size_t size, const abi::CUmemAccessDesc* desc,
                                      size_t count) {
  abi::CUresult rc = Real().mem_set_access(va, size, desc, count);
  if (rc != abi::CUDA_SUCCESS || desc == nullptr) return rc;
  std::vector<AccessGrant> grants;
  for (size_t i = 0; i < count; ++i) grants.push_back({desc[i].location.id, desc[i].flags});
  MutexLock lock(mu_);
  objects_.SetAccess(va, size, grants);
  return rc;
}

abi::CUresult DeviceMemory::Export(void* shareable, abi::CUmemGenericAllocationHandle handle,
                                   abi::CUmemAllocationHandleType type, unsigned long long flags) {
  const RealDriver& d = Real();
  if (!VmmTable::IsObjectId(handle)) return d.mem_export(shareable, handle, type, flags);
  MutexLock lock(mu_);
  VmmObject* o = objects_.Find(handle);
  if (o == nullptr || o->real == 0) return abi::CUDA_ERROR_INVALID_VALUE;
  abi::CUresult rc = d.mem_export(shareable, o->real, type, flags);
  if (rc == abi::CUDA_SUCCESS && type == abi::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    int fd = 0;
    std::memcpy(&fd, shareable, sizeof fd);
    int kept = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (kept >= 0) exported_fds_.push_back({handle, kept});
  }
  return rc;
}

abi::CUresult DeviceMemory::Import(abi::CUmemGenericAllocationHandle* handle, void* os_handle,
                                   abi::CUmemAllocationHandleType type) {
  const RealDriver& d = Real();
  if (type != abi::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || handle == nullptr)
    return d.mem_import(handle, os_handle, type);
  int fd = static_cast<int>(reinterpret_cast<intptr_t>(os_handle));
  UniqueFd kept(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  abi::CUmemGenericAllocationHandle real = 0;
  abi::CUresult rc = d.mem_import(&real, os_handle, type);
  if (rc != abi::CUDA_SUCCESS) return rc;
  abi::CUmemAllocationProp prop{};
  if (d.mem_properties(&prop, real) == abi::CUDA_SUCCESS && prop.location.type != abi::CU_MEM_LOCATION_TYPE_DEVICE) {
    // Another process's host memory object: the exporter does not track it
    // either (Create), so it stays the driver's.
    *handle = real;
    return rc;
  }
  VmmObject o;
  o.real = real;
  o.imported = true;
  o.app_refs = 1;
  o.kept_fd = kept.Release();
  o.device = prop.location.id;
  std::memcpy(o.prop.data(), &prop, sizeof prop);
  MutexLock lock(mu_);
  *handle = objects_.AddObject(o);
  return rc;
}

abi::CUresult DeviceMemory::Retain(abi::CUmemGenericAllocationHandle* handle, void* addr) {
  {
    MutexLock lock(mu_);
    auto m = objects_.MappingContaining(reinterpret_cast<uint64_t>(addr));
    if (m && handle != nullptr) {
      ++objects_.Find(m->object)->app_refs;
      *handle = m->object;
      return abi::CUDA_SUCCESS;
    }
  }
  return Real().mem_retain(handle, addr);
}

abi::CUresult DeviceMemory::PropertiesOf(abi::CUmemAllocationProp* prop, abi::CUmemGenericAllocationHandle handle) {
  if (!VmmTable::IsObjectId(handle)) return Real().mem_properties(prop, handle);
  MutexLock lock(mu_);
  VmmObject* o = objects_.Find(handle);
  if (o == nullptr || prop == nullptr) return abi::CUDA_ERROR_INVALID_VALUE;
  std::memcpy(prop, o->prop.data(), sizeof *prop);
  return abi::CUDA_SUCCESS;
}

std::optional<abi::CUresult> DeviceMemory::IpcGet(abi::CUipcMemHandle* out, abi::CUdeviceptr ptr) {
  auto identity = ControlSocketIdentity();
  if (!identity || out == nullptr) return std::nullopt;
  IpcHandle h{identity->pid_namespace_inode, identity->pid, 0, 0, 0, identity->generation};
  MutexLock lock(mu_);
  if (auto a = registry_.FindContaining(ptr); a && a->handle != 0) {
    h.object = a->va;
    h.offset = ptr - a->va;
    h.size = a->size;
  } else if (auto m = objects_.MappingContaining(ptr); m && !objects_.Find(m->object)->imported) {
    h.object = m->object;
    h.offset = m->offset + (ptr - m->va);
    h.size = objects_.Find(m->object)->size;
  } else {
    return std::nullopt;
  }
  EncodeIpcHandle(h, reinterpret_cast<unsigned char*>(out->reserved));
  return abi::CUDA_SUCCESS;
}

std::optional<abi::CUresult> DeviceMemory::IpcOpen(abi::CUdeviceptr* ptr, const abi::CUipcMemHandle& handle) {
  auto h = DecodeIpcHandle(reinterpret_cast<const unsigned char*>(handle.reserved));
  if (!h) return std::nullopt;
  if (ptr == nullptr) return abi::CUDA_ERROR_INVALID_VALUE;
  // Not under mu_: the exporter may be asking us the same at this moment.
  ControlRequest req;
  req.command = ShimCommand::kExport;
  req.object = h->object;
  auto got = ExchangeControlLine(ControlSocketName(h->pid_namespace_inode, h->pid, h->generation), FormatControlRequest(req), 30000,
                                 -1, "cuIpcOpenMemHandle: asking the exporting process");
  if (!got.ok() || !ParseControlReply(got->reply).ok() || !got->passed_fd.valid()) {
    std::fprintf(stderr, "gpusnap-gpushare: cuIpcOpenMemHandle: %s\n",
                 got.ok() ? got->reply.c_str() : got.status().ToString().c_str());
    return abi::CUDA_ERROR_INVALID_HANDLE;
  }
  const RealDriver& d = Real();
  abi::CUcontext ctx = nullptr;
  abi::CUdevice dev = 0;
  if (d.ctx_get_current(&ctx) != abi::CUDA_SUCCESS || ctx == nullptr || d.ctx_get_device(&dev) != abi::CUDA_SUCCESS)
    return abi::CUDA_ERROR_INVALID_CONTEXT;
  abi::CUmemGenericAllocationHandle real = 0;
  abi::CUresult rc = d.mem_import(&real, reinterpret_cast<void*>(static_cast<intptr_t>(got->passed_fd.get())),
                                  abi::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (rc != abi::CUDA_SUCCESS) return rc;
  abi::CUdeviceptr va = 0;
  rc = d.address_reserve(&va, h->size, 0, 0, 0);
  VmmMapping m{va, h->size, 0, 0, reinterpret_cast<uint64_t>(ctx), {{dev, abi::CU_MEM_ACCESS_FLAGS_PROT_READWRITE}}};
  if (rc == abi::CUDA_SUCCESS) {
    rc = d.mem_map(va, h->size, 0, real, 0);
    if (rc == abi::CUDA_SUCCESS && (rc = GrantAccess(m)) != abi::CUDA_SUCCESS) d.mem_unmap(va, h->size);
    if (rc != abi::CUDA_SUCCESS) d.address_free(va, h->size);
  }
  if (rc != abi::CUDA_SUCCESS) {
    d.mem_release(real);
    return rc;
  }
  VmmObject o;
  o.real = real;
  o.size = h->size;
  o.device = dev;
  o.imported = true;
  o.kept_fd = got->passed_fd.Release();
  o.ipc_range = va;
  o.ipc_pointer = va + h->offset;
  MutexLock lock(mu_);
  m.object = objects_.AddObject(o);
  objects_.AddMapping(m);
  *ptr = va + h->offset;
  return abi::CUDA_SUCCESS;
}

std::optional<abi::CUresult> DeviceMemory::IpcClose(abi::CUdeviceptr ptr) {
  MutexLock lock(mu_);
  for (VmmObject* o : objects_.Objects()) {
    if (o->ipc_pointer != ptr || o->ipc_range == 0) continue;
    const RealDriver& d = Real();
    uint64_t range = o->ipc_range, size = o->size, id = o->id;
    if (o->real != 0) d.mem_unmap(range, size);
    objects_.RemoveMapping(range);
    DropIfUnused(id);
    d.address_free(range, size);
    return abi::CUDA_SUCCESS;
  }
  return std::nullopt;
}

Result<UniqueFd> DeviceMemory::ExportFd(uint64_t object) {
  MutexLock lock(mu_);
  if (state_ == ShimState::kReleased)
    return Status::Error(Code::kFailedPrecondition, "export: the device memory is released");
  abi::CUmemGenericAllocationHandle real = 0;
  int fd = -1;
  if (auto a = registry_.FindStart(object); a && a->handle != 0) {
    real = a->handle;
    if (auto adopted = adopted_fds_.find(a->va); adopted != adopted_fds_.end())
      fd = ::fcntl(adopted->second, F_DUPFD_CLOEXEC, 0);
  } else if (VmmObject* o = objects_.Find(object); o != nullptr && !o->imported && o->real != 0) {
    real = o->real;
  } else {
    return Status::Error(Code::kNotFound, "export: no device memory object {:#x} in this process", object);
  }
  if (fd < 0) {
    abi::CUresult rc = Real().mem_export(&fd, real, abi::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (rc != abi::CUDA_SUCCESS) return Real().Error("cuMemExportToShareableHandle", rc).Wrap("export");
  }
  int kept = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (kept >= 0) exported_fds_.push_back({object, kept});
  return UniqueFd(fd);
}

Status DeviceMemory::Remap(uint64_t import, UniqueFd fd) {
  MutexLock lock(mu_);
  VmmObject* o = objects_.Find(import);
  if (o == nullptr || !o->imported)
    return Status::Error(Code::kNotFound, "remap: no imported device memory {:#x} in this process", import);
  if (o->real != 0) {
    // Still mapped: this process's own release failed and the exporter's
    // memory is new since. The old mapping goes, whatever is left of it.
    for (const VmmMapping& m : objects_.MappingsOf(import)) Real().mem_unmap(m.va, m.size);
    Real().mem_release(o->real);
    o->real = 0;
    if (o->kept_fd >= 0) ::close(o->kept_fd);
    o->kept_fd = -1;
  }
  abi::CUmemGenericAllocationHandle real = 0;
  abi::CUresult rc = Real().mem_import(&real, reinterpret_cast<void*>(static_cast<intptr_t>(fd.get())),
                                       abi::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (rc != abi::CUDA_SUCCESS) return Real().Error("cuMemImportFromShareableHandle", rc).Wrap("remap");
  if (Status st = MapMappings(objects_.MappingsOf(import), real); !st.ok()) {
    for (const VmmMapping& m : objects_.MappingsOf(import)) Real().mem_unmap(m.va, m.size);
    Real().mem_release(real);
    return st.Wrap("remap");
  }
  o->real = real;
  o->kept_fd = fd.Release();
  return Status::Ok();
}

Result<std::vector<TrackedAllocation>> DeviceMemory::ObjectRanges(bool released) {
  MutexLock lock(mu_);
  std::vector<TrackedAllocation> out;
  for (VmmObject* o : objects_.Objects()) {
    if (o->imported || (o->real == 0) != released) continue;
    auto whole = objects_.WholeMappingOf(o->id);
    if (!whole)
      return Status::Error(Code::kFailedPrecondition,
                           "device memory object {:#x} ({} bytes) is not mapped whole at one address, so gpushare "
                           "cannot save and load it",
                           o->id, o->size);
    if (whole->context == 0)
      return Status::Error(Code::kFailedPrecondition, "device memory object {:#x} was mapped with no current context",
                           o->id);
    TrackedAllocation a;
    a.va = whole->va;
    a.size = o->size;
    a.requested = o->size;
    a.device = o->device;
    a.context = whole->context;
    out.push_back(a);
  }
  return out;
}

Status DeviceMemory::FreeObjects() {
  MutexLock lock(mu_);
  const RealDriver& d = Real();
  for (VmmObject* o : objects_.Objects()) {
    if (o->real == 0) continue;
    for (const VmmMapping& m : objects_.MappingsOf(o->id)) {
      if (abi::CUresult rc = d.mem_unmap(m.va, m.size); rc != abi::CUDA_SUCCESS)
        return Real().Error("cuMemUnmap", rc).Wrap(fmt::format("release: {:#x} ({} bytes)", m.va, m.size));
    }
    if (abi::CUresult rc = d.mem_release(o->real); rc != abi::CUDA_SUCCESS)
      return Real().Error("cuMemRelease", rc).Wrap("release");
    o->real = 0;
    if (o->kept_fd >= 0) ::close(o->kept_fd);
    o->kept_fd = -1;
  }
  CloseExportedFds(0);
  return Status::Ok();
}

Status DeviceMemory::MakeObjects() {
  MutexLock lock(mu_);
  const RealDriver& d = Real();
  for (VmmObject* o : objects_.Objects()) {
    if (o->imported || o->real != 0) continue;
    abi::CUmemAllocationProp prop{};
    std::memcpy(&prop, o->prop.data(), sizeof prop);
    abi::CUmemGenericAllocationHandle real = 0;
    if (abi::CUresult rc = d.mem_create(&real, o->size, &prop, 0); rc != abi::CUDA_SUCCESS)
      return Real().Error("cuMemCreate", rc).Wrap(fmt::format("making {:#x} again", o->id));
    if (Status st = MapMappings(objects_.MappingsOf(o->id), real); !st.ok()) {
      d.mem_release(real);
      return st;
    }
    o->real = real;
  }
  return Status::Ok();
}

nlohmann::json DeviceMemory::DescribeSharing() {
  MutexLock lock(mu_);
  nlohmann::json exports = nlohmann::json::array(), imports = nlohmann::json::array();
  uint64_t objects = 0, object_bytes = 0, released_bytes = 0;
  for (const auto& [object, fd] : exported_fds_) exports.push_back({{"object", object}, {"fd", fd}});
  for (VmmObject* o : objects_.Objects()) {
    if (o->imported && o->kept_fd >= 0) imports.push_back({{"import", o->id}, {"fd", o->kept_fd}});
    if (!o->imported) {
      ++objects;
      object_bytes += o->size;
      if (o->real == 0) released_bytes += o->size;
    }
  }
  return {{"exports", exports},
          {"imports", imports},
          {"objects", objects},
          {"object_bytes", object_bytes},
          {"object_released_bytes", released_bytes}};
}

}  // namespace gpusnap::gpushare::shim
