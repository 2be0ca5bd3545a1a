// An array of zero-filled pages from mmap: nothing is resident until an
// element is written, so tables sized for the most a pool may ever hold cost
// only what is used.  Element types must be valid when all bytes are zero.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <new>
#include <type_traits>

namespace chi {

template <class T>
class ZeroedArray {
  static_assert(std::is_trivially_destructible<T>::value, "no destructor is ever run");

 public:
  ZeroedArray() = default;
  ZeroedArray(const ZeroedArray &) = delete;
  ZeroedArray &operator=(const ZeroedArray &) = delete;
  ~ZeroedArray() { reset(); }

  // Throws std::bad_alloc when the mapping fails.
  void allocate(size_t count) {
    reset();
    if (count == 0) return;
    size_t bytes = count * sizeof(T);
    void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<T *>(p);
    bytes_ = bytes;
  }

  void reset() {
    if (data_) munmap(data_, bytes_);
    data_ = nullptr;
    bytes_ = 0;
  }

  T &operator[](size_t i) const { return data_[i]; }

 private:
  T *data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace chi
