// CPtr: a C library's object owned by a unique_ptr that frees it with the
// library's own function, e.g. CPtr<EVP_PKEY_CTX, EVP_PKEY_CTX_free>.
#pragma once

#include <memory>

namespace gpusnap {

template <typename T, auto Free>
struct CFree {
  void operator()(T* p) const { Free(p); }
};

template <typename T, auto Free>
using CPtr = std::unique_ptr<T, CFree<T, Free>>;

}  // namespace gpusnap
