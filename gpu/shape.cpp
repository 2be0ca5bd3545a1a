#include "gpu/shape.h"

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "chimaera/config.h"
#include "chimaera_device.h"
#include "base/log.h"

namespace chi::gpu {

namespace {

uint32_t floor_pow2(uint32_t v) {
  uint32_t p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}

// CPU threads per GPU serving GPU->CPU tasks.  CHI_GPU_POLLERS (1..16) is a
// tuning knob until the configuration grows a key for it.
uint32_t cpu_pollers() {
  if (const char *e = std::getenv("CHI_GPU_POLLERS")) {
    long v = std::strtol(e, nullptr, 10);
    if (v >= 1 && v <= 16) return floor_pow2(uint32_t(v));
    log(LogLevel::kWarn, "CHI_GPU_POLLERS=%s ignored (1..16)", e);
  }
  // Measured on an H100 host with 16 hardware threads, chimaera-bench's
  // "gpu0->cpu 1056 warps" row at 64 bytes (2026-11-27, lab/journal/gpu-routes.md):
  // 4 pollers 15-22, 8 pollers 37-41 M tasks/s.  Poller k serves tickets k,
  // k + P, ...: one thread's lone tasks reach each poller every P round
  // trips, so an idle poller spins while any poller of the group serves
  // (CpuPoller::run), else 8 pollers made lone 1 KiB tasks 10-17 us slower.
  const unsigned hw = std::thread::hardware_concurrency();
  return hw >= 16 ? 8 : hw >= 8 ? 2 : 1;
}

// How long chi_dev_wait polls before it starts to nap.  CHI_GPU_WAIT_SPIN_NS
// (0..10000000) is a tuning knob until the configuration grows a key for it:
// spinning keeps a round trip free of nap granularity; napping later spares
// the memory system when thousands of warps wait for long tasks.
uint32_t wait_spin_ns() {
  if (const char *e = std::getenv("CHI_GPU_WAIT_SPIN_NS")) {
    char *end = nullptr;
    long v = std::strtol(e, &end, 10);
    if (end != e && *end == '\0' && v >= 0 && v <= 10000000) return uint32_t(v);
    log(LogLevel::kWarn, "CHI_GPU_WAIT_SPIN_NS=%s ignored (0..10000000)", e);
  }
  return 20000;
}

}  // namespace

Shape make_shape(const Config &cfg, int sm_count) {
  Shape s;
  const uint32_t warp = CHI_HAVE_HIP ? 64 : 32;
  // The orchestrator is meant to leave most of the GPU to other kernels.
  uint32_t max_blocks = sm_count > 1 ? uint32_t(sm_count) / 2 : 1;
  s.blocks = cfg.gpu.blocks;
  if (s.blocks == 0) {
    // One block per 8 SMs, 1..16.  GPU->GPU throughput grows with the
    // worker warps; on an H200 (132 SMs, 4-warp blocks, chimaera-bench's
    // "gpu0->local 1056 warps" row at 64 B, 2026-11-27) 4 blocks gave 7.6,
    // 16 blocks 35 M tasks/s, for a footprint on a grid-filling FMA kernel
    // of +1.3-1.5% either way and on a copy kernel of +5.7-6.1% against
    // +6.6-7.2% (lab/journal/gpu-routes.md, "How many orchestrator warps").
    s.blocks = std::clamp<uint32_t>(sm_count > 0 ? uint32_t(sm_count) / 8 : 1, 1, 16);
  } else if (s.blocks > max_blocks) {
    log(LogLevel::kWarn, "gpu.blocks %u lowered to %u (half of the GPU's %d SMs)", s.blocks,
        max_blocks, sm_count);
    s.blocks = max_blocks;
  }
  uint32_t wpb = cfg.gpu.warps_per_block;
  if (wpb > CHI_DEV_ORCH_MAX_WARPS_PER_BLOCK) {
    log(LogLevel::kWarn, "gpu.warps_per_block %u lowered to %u (the orchestrator kernel's largest block)",
        wpb, CHI_DEV_ORCH_MAX_WARPS_PER_BLOCK);
    wpb = CHI_DEV_ORCH_MAX_WARPS_PER_BLOCK;
  }
  s.threads = wpb * warp;
  s.nwarps = s.blocks * wpb;
  // Half the warps poll the CPU->GPU ring, the rest run GPU->GPU tasks:
  // few polling warps, each covering more entries, spare the PCIe bus.
  s.h2d_pollers = s.nwarps == 1 ? 1 : floor_pow2(s.nwarps / 2);
  if (s.h2d_pollers > 8) s.h2d_pollers = 8;
  s.h2d_slots = cfg.gpu.queue_depth;
  // Pollers serve tickets modulo their count, so one of them may lag: a ring
  // of slots x pollers entries is never overrun by tasks that hold slots.
  s.h2d_ring_entries = s.h2d_slots * s.h2d_pollers;
  s.dslots = cfg.gpu.device_slots;
  s.cpu_pollers = cpu_pollers();
  s.d2h_ring_entries = s.dslots * s.cpu_pollers;
  s.wait_spin_ns = wait_spin_ns();
  s.submit_timeout_us = cfg.gpu.device_submit_timeout_us;
  s.max_payload = cfg.gpu.max_payload;
  s.lease_ns = uint64_t(cfg.gpu.lease_us) * 1000;
  s.idle_lease_ns = std::max<uint64_t>(s.lease_ns, uint64_t(cfg.gpu.idle_lease_us) * 1000);
  if (!s.lease_ns) s.idle_lease_ns = 0;
  uint64_t stride = (uint64_t(s.max_payload) + 63) & ~uint64_t(63);
  s.payload_stride = stride < 128 ? 128 : stride;  // room for the 112 inline bytes
  return s;
}

}  // namespace chi::gpu
