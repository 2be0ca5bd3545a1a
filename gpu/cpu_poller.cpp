#include "gpu/cpu_poller.h"

#include <time.h>

#include <cstring>
#include <memory>

#include "core/futex.h"
#include "base/log.h"
#include "core/registry.h"
#include "core/runtime.h"
#include "gpu/h2d_executor.h"
#include "gpu/ll.h"

namespace chi::gpu {

namespace {
thread_local bool t_on_poller = false;
}

bool on_poller_thread() { return t_on_poller; }

CpuPoller::CpuPoller(Runtime &rt, int32_t gpu, const Shape &shape, uint64_t *ring,
                     uint64_t *reply, uint8_t *buf, H2dExecutor *reaper)
    : rt_(rt), gpu_(gpu), shape_(shape), ring_(ring), reply_(reply), buf_(buf), reaper_(reaper) {}

void CpuPoller::start() {
  stop_.store(false, std::memory_order_relaxed);
  for (uint32_t p = 0; p < shape_.cpu_pollers; ++p) threads_.emplace_back([this, p] { run(p); });
}

void CpuPoller::stop() {
  stop_.store(true, std::memory_order_release);
  for (auto &t : threads_) t.join();
  threads_.clear();
}

// Serves the entry of `ticket` if a kernel has published it; false if not yet.
bool CpuPoller::serve(uint64_t ticket, unsigned char *in, unsigned char *out) {
  const uint64_t *e = ring_ + (ticket & (shape_.d2h_ring_entries - 1)) * CHI_DEV_LL_WORDS;
  const uint32_t flag = uint32_t(ticket) + 1;
  uint64_t w0 = ll_load(e);
  if (ll_flag(w0) != flag) return false;
  // Under load the next entries of this thread are likely written already:
  // start their cache misses now, so they overlap this entry's handler.
  const uint32_t step = shape_.cpu_pollers;
  for (uint32_t k = 1; k <= 2; ++k) {
    const char *n = reinterpret_cast<const char *>(
        ring_ + ((ticket + k * step) & (shape_.d2h_ring_entries - 1)) * CHI_DEV_LL_WORDS);
    for (uint32_t b = 0; b < CHI_DEV_LL_WORDS * 8; b += 64) __builtin_prefetch(n + b);
  }
  // The header's words are one 16-byte store each; the data words came before.
  uint64_t w[4] = {w0, 0, 0, 0};
  for (int i = 1; i < 4; ++i)
    while (ll_flag(w[i] = ll_load(e + i)) != flag)
      if (stop_.load(std::memory_order_relaxed)) return false;  // writer died mid-entry
  const chi_method_t method = ll_data(w[0]);
  const uint32_t size = ll_data(w[1]);
  const uint32_t slot = ll_data(w[2]);
  const uint32_t gen = ll_data(w[3]);
  if (slot >= shape_.dslots) {
    // Nobody can be waiting on such a slot: report and skip the entry.
    log(LogLevel::kError, "GPU %d: GPU->CPU ring entry names slot %u of %u; dropped", gpu_, slot,
        shape_.dslots);
    return true;
  }
  chi_status_t status;
  size_t osize = 0;
  if (size > shape_.max_payload) {
    status = CHI_ERR_PROTOCOL;
  } else {
    const void *input = in;
    if (size <= CHI_DEV_LL_INLINE) {
      while (!ll_get_payload(e, in, size, flag))
        if (stop_.load(std::memory_order_relaxed)) return false;
    } else {
      input = buf_ + slot * shape_.payload_stride;  // fenced before the entry
    }
    status = run_cpu_handler(rt_.registry(), method, gpu_, input, size, out, shape_.max_payload,
                             &osize);
  }
  uint64_t *r = reply_ + uint64_t(slot) * CHI_DEV_LL_WORDS;
  if (osize <= CHI_DEV_LL_INLINE) {
    ll_put_payload(r, out, uint32_t(osize), gen);
  } else {
    std::memcpy(buf_ + slot * shape_.payload_stride, out, osize);
  }
  ll_store(r + 1, ll_pack(uint32_t(osize), gen));
  ll_store(r, ll_pack(uint32_t(status), gen));
  return true;
}

void CpuPoller::run(uint32_t part) {
  t_on_poller = true;
  std::unique_ptr<unsigned char[]> in(new unsigned char[shape_.payload_stride]);
  std::unique_ptr<unsigned char[]> out(new unsigned char[shape_.payload_stride]);
  const Config &cfg = rt_.config();
  const int64_t spin_ns = cfg.gpu.poller_spin_ns;
  const int64_t max_nap = int64_t(cfg.gpu.poll_interval_us) * 1000;
  const uint32_t step = shape_.cpu_pollers;
  uint64_t ticket = part;
  int64_t idle_since = 0, nap = 1000, last_reap = 0;
  uint32_t idle_polls = 0;
  while (!stop_.load(std::memory_order_acquire)) {
    if (serve(ticket, in.get(), out.get())) {
      ticket += step;
      idle_since = 0;
      idle_polls = 0;
      nap = 1000;
      continue;
    }
    // Idle: spin (cheap: the line stays in this core's cache until a GPU
    // write invalidates it), then nap longer and longer, up to poll_interval_us.
    if ((++idle_polls & 255) != 0) {
      cpu_relax();
      continue;
    }
    int64_t now = now_ns();
    if (idle_since == 0) idle_since = now;
    if (part == 0 && reaper_ && now - last_reap > 1000000) {
      reaper_->reap();
      last_reap = now;
    }
    if (now - idle_since < spin_ns || max_nap <= 0) continue;
    timespec ts{0, long(nap)};
    nanosleep(&ts, nullptr);
    nap = nap * 2 < max_nap ? nap * 2 : max_nap;
  }
}

}  // namespace chi::gpu
