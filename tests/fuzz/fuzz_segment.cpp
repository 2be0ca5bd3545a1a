// What a hostile client can write into its shared segment: the input bytes
// overwrite the ring and the first slots of a fresh session, then the
// server's poller takes what it finds.  The server must answer with statuses
// or cut the session off: no crash, no read or write outside the segment
// (AddressSanitizer), every task it took finished.
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/runtime.h"
#include "ipc/wire.h"
#include "server/service.h"
#include "server/session.h"

namespace {

chi::Service *server() {
  static chi::Service *svc = [] {
    chi::Config cfg;
    cfg.workers = 1;
    cfg.queue_depth = 64;
    cfg.server.client_max_in_flight = 64;
    cfg.max_inline_payload = 128;
    cfg.gpu.devices = 0;
    cfg.gpu.max_payload = 128;
    cfg.log_level = chi::LogLevel::kError;
    auto *r = new chi::Runtime(cfg);
    if (r->start() != CHI_OK) abort();
    return new chi::Service(*r);
  }();
  return svc;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  chi::Service *svc = server();
  chi::Session s(*svc, 1, -1, 0, 0, chi::ipc::kSessionTasks);
  if (s.create_segment(8) != CHI_OK) abort();
  const chi::ipc::SegmentLayout &l = s.layout();
  // The bytes land on the ring and on the slot area, as a client could write them.
  chi::ipc::SegmentView v;
  v.layout = l;
  v.base = s.segment_base();
  size_t ring_bytes = l.slots_offset - l.ring_offset;
  size_t n = std::min(size, size_t(ring_bytes + 8 * l.slot_stride));
  size_t first = std::min(n, size_t(8 * sizeof(chi::ipc::RingCell)));
  std::memcpy(v.base + l.ring_offset, data, first);
  if (n > first) std::memcpy(v.base + l.slots_offset, data + first, std::min(n - first, size_t(8 * l.slot_stride)));
  for (int round = 0; round < 4 && !s.dead(); ++round) s.poll(64);
  while (s.in_flight() != 0) sched_yield();  // tasks it took finish into the segment
  return 0;
}
