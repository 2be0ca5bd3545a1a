// The orchestrator's shape (gpu/shape.cpp) from the configuration and the
// GPU's SM count: gpu.blocks 0 (the default) gives one block per 8 SMs,
// 1..16; an explicit grid over half the SMs, or blocks over the kernel's
// largest, is lowered; the CPU->GPU pollers are half the warps, a power of
// two, at most 8, and the other warps serve GPU->GPU tasks.  Runs in every
// build (no GPU needed: the shape is host arithmetic).
#include <cstdint>

#include "chimaera/config.h"
#include "chimaera_device.h"
#include "gpu/shape.h"

extern "C" {
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
}

namespace {

constexpr uint32_t kWarp = CHI_HAVE_HIP ? 64u : 32u;

chi::gpu::Shape shape(uint32_t blocks, uint32_t warps_per_block, int sms) {
  chi::Config cfg;
  if (blocks != ~0u) cfg.gpu.blocks = blocks;
  if (warps_per_block != ~0u) cfg.gpu.warps_per_block = warps_per_block;
  return chi::gpu::make_shape(cfg, sms);
}

void test_default_grid(void **) {
  chi::Config cfg;
  assert_int_equal(cfg.gpu.blocks, 0); /* the default: sized from the GPU */
  const struct {
    int sms;
    uint32_t blocks;
  } cases[] = {{132, 16}, {144, 16}, {1024, 16}, {108, 13}, {80, 10}, {20, 2}, {8, 1}, {7, 1}, {1, 1}, {0, 1}};
  for (const auto &c : cases) {
    const chi::gpu::Shape s = shape(~0u, ~0u, c.sms);
    if (s.blocks != c.blocks) fail_msg("%d SMs: %u blocks, want %u", c.sms, s.blocks, c.blocks);
    assert_int_equal(s.threads, 4u * kWarp);
    assert_int_equal(s.nwarps, c.blocks * 4u);
  }
  /* An H100 or H200: 16 x 4 warps, 8 of them CPU->GPU pollers, 56 GPU->GPU workers. */
  const chi::gpu::Shape h = shape(~0u, ~0u, 132);
  assert_int_equal(h.nwarps, 64);
  assert_int_equal(h.h2d_pollers, 8);
}

void test_explicit_grid(void **) {
  chi::gpu::Shape s = shape(4, 4, 132);
  assert_int_equal(s.blocks, 4);
  assert_int_equal(s.nwarps, 16);
  assert_int_equal(s.h2d_pollers, 8);
  s = shape(100, 4, 132); /* over half of the SMs: lowered */
  assert_int_equal(s.blocks, 66);
  s = shape(3, 4, 4);
  assert_int_equal(s.blocks, 2);
  s = shape(1, 1, 132); /* one warp does both jobs */
  assert_int_equal(s.nwarps, 1);
  assert_int_equal(s.h2d_pollers, 1);
  s = shape(1, 6, 132); /* pollers: half the warps, rounded down to a power of two */
  assert_int_equal(s.h2d_pollers, 2);
  s = shape(2, 32, 132); /* over the kernel's largest block: lowered */
  assert_int_equal(s.threads, CHI_DEV_ORCH_MAX_WARPS_PER_BLOCK * kWarp);
  assert_int_equal(s.nwarps, 2u * CHI_DEV_ORCH_MAX_WARPS_PER_BLOCK);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_default_grid),
      cmocka_unit_test(test_explicit_grid),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
