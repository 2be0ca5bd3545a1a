// Latency samples kept in a fixed buffer (often shared memory written by a
// client process): a uniform subset of every sample offered.
#pragma once

#include <cstdint>

namespace chi_bench {

struct Sampler {
  uint64_t *buf;
  uint64_t cap, n = 0, stride = 1, k = 0;
  // When full, every other sample goes and the stride doubles.
  void add(uint64_t v) {
    if (k++ % stride != 0) return;
    if (n == cap) {
      for (uint64_t j = 0; j < cap / 2; j++) buf[j] = buf[2 * j];
      n = cap / 2;
      stride *= 2;
      if ((k - 1) % stride != 0) return;
    }
    buf[n++] = v;
  }
};

}  // namespace chi_bench
