// Cache-line-aligned vectors for run-time buffers.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace sl {

// Vectors of run-time buffers (activations, scores) start on a cache line, so with rows padded
// to kColAlign columns a kernel's 64-byte load never straddles two lines (on the 16-byte
// boundary malloc gives, the W8A8 kernels' activation loads split, and speed depended on where
// a process's buffer happened to land).
template <class T>
struct CacheAligned {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  CacheAligned() = default;
  template <class U>
  CacheAligned(const CacheAligned<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kAlign); }
  template <class U>
  bool operator==(const CacheAligned<U>&) const { return true; }
  template <class U>
  bool operator!=(const CacheAligned<U>&) const { return false; }
};
template <class T>
using AlignedVector = std::vector<T, CacheAligned<T>>;

}  // namespace sl
