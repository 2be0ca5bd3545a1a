#include "core/cpu_executor.h"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "base/futex.h"
#include "base/log.h"
#include "core/slot_word.h"
#include "core/trace.h"

namespace chi {

namespace {

// Nested chi_wait calls on a worker run queued tasks while they wait.  Past
// this depth they run only their own worker's queue (the children of the
// tasks on their stack), so helping cannot grow the stack without bound
// while every waited-for task still gets a thread that runs it.
constexpr int kMaxHelpDepth = 16;

// initial-exec: these are read on every submit and wait, and the default
// TLS model of a shared library costs a call per access.
#define CHI_TLS thread_local __attribute__((tls_model("initial-exec")))
CHI_TLS const void *tls_pool = nullptr;
CHI_TLS uint32_t tls_worker = 0;
CHI_TLS int tls_help_depth = 0;
CHI_TLS const void *tls_inline_pool = nullptr;  // the pool whose task this application thread runs (inline_wait)
CHI_TLS bool tls_submit_never_blocks = false;
CHI_TLS uint32_t tls_free_hint = 0;  // the free-slot shard this thread last took from
CHI_TLS uint32_t tls_pops = 0;       // pop_task calls of this worker
// Tasks a worker took with its last pop_batch and has not run yet: its next
// pops, before any queue (handlers' chi_wait included, so a handler that
// waits for one of them runs it).
CHI_TLS chi::QueuedTask tls_held[chi::RunQueue::kMaxPopMany];
CHI_TLS uint32_t tls_held_next = 0, tls_held_end = 0;
constexpr uint32_t kRotateEvery = 16;
// A spinning worker that is not the watcher looks at the queues itself once
// in this many polls (a few us).
constexpr unsigned kSpinnerLookEvery = 64;
// Spinners by default (worker_spinners 0): half the CPUs, at most this many.
constexpr unsigned kDefaultMaxSpinners = 4;

// Free-slot shards and run queues of application threads: enough that the
// submitters of a 16-core machine each have their own (threads share them
// beyond that), few enough that an idle worker polls them all cheaply.
constexpr uint32_t kFreeShards = 32;
constexpr uint32_t kMaxSharedRings = 16;

// Ring cells of the application threads' run queues (all together, at least
// kMinSharedRingCells each) and of each worker's own queue; deeper queues
// spill into lists (see run_queue.h).  A ring's memory is touched as its
// positions cycle, so these bound it (128 bytes a cell).
constexpr uint32_t kSharedRingCells = 4096;
constexpr uint32_t kMinSharedRingCells = 256;
constexpr uint32_t kWorkerRingCells = 1024;

// The slot arena is reserved whole and committed in steps of at least this
// much, doubling: a pool that never holds more than a few tasks at once
// touches a few pages, however large queue_depth is.
constexpr size_t kMinCommitBytes = size_t(256) << 10;

uint32_t ring_cells(uint32_t slots, uint32_t cap) {
  uint32_t n = 2;
  while (n < slots && n < cap) n <<= 1;
  return n;
}

}  // namespace

// A slot is [small input | header | output | large input].  The header and
// the start of the output share a 128-byte line pair, so the waiter that
// sees the state word change finds a small output already in its cache.  An
// input of at most RunQueue::kInline bytes (most of them) sits in the line
// pair before the header, so a small task touches one or two pages of its
// slot, not the far end of a payload-sized input area.
struct CpuExecutor::Slot {
  std::atomic<uint32_t> state;
  chi_status_t status;
  // Atomic: a waiter that lost the claim may read it while the slot's next task writes it.
  std::atomic<uint32_t> output_size;
  chi_method_t method;
  int64_t submit_ns;  // 0: not timed (RouteStats samples one task in kSampleEvery)
  RemoteSink *sink;  // kRemote slots only
  uint64_t cookie;
};
// A slot never used is zero pages: state 0 is generation 0, kFree.
static_assert(slot::kFree == 0, "fresh slots must read as free");

CpuExecutor::CpuExecutor(const Config &cfg, const Registry &reg, RouteStats &stats)
    : cfg_(cfg), reg_(reg), stats_(stats) {}

CpuExecutor::~CpuExecutor() {
  shutdown();
  if (arena_) munmap(arena_, arena_size_);
}

namespace {
struct WorkerStart {
  CpuExecutor *pool;
  unsigned id;
};
}  // namespace

void *CpuExecutor::worker_entry(void *arg) {
  WorkerStart start = *static_cast<WorkerStart *>(arg);
  delete static_cast<WorkerStart *>(arg);
  start.pool->worker_main(start.id);
  return nullptr;
}

chi_status_t CpuExecutor::start_worker(unsigned id) {
  pthread_attr_t attr;
  if (int e = pthread_attr_init(&attr); e != 0)
    return set_error(CHI_ERR_NOMEM, "cannot start worker thread: %s", strerror(e));
  int e = 0;
  if (cfg_.worker_stack_size) e = pthread_attr_setstacksize(&attr, size_t(cfg_.worker_stack_size));
  if (e != 0) {
    pthread_attr_destroy(&attr);
    return set_error(CHI_ERR_CONFIG, "worker_stack_size %llu refused by the system: %s",
                     (unsigned long long)cfg_.worker_stack_size, strerror(e));
  }
  auto *arg = new WorkerStart{this, id};
  pthread_t t;
  e = pthread_create(&t, &attr, &CpuExecutor::worker_entry, arg);
  pthread_attr_destroy(&attr);
  if (e != 0) {
    delete arg;
    return set_error(CHI_ERR_NOMEM, "cannot start worker thread %u (stack %llu bytes): %s", id,
                     (unsigned long long)cfg_.worker_stack_size, strerror(e));
  }
  workers_.push_back(t);
  return CHI_OK;
}

chi_status_t CpuExecutor::start() {
  nslots_ = cfg_.queue_depth;
  payload_ = cfg_.max_inline_payload;
  // Input and output of a slot are separate so handlers never see aliasing;
  // 128-byte alignment keeps slots off each other's line pairs.  Inputs up to
  // RunQueue::kInline travel in the queue cell and are copied to the slot's
  // small input area by the worker; only larger ones use the large area.
  large_input_at_ = (kSmallInput + sizeof(Slot) + payload_ + 63) & ~size_t(63);
  size_t large = payload_ > RunQueue::kInline ? (payload_ + 63) & ~size_t(63) : 0;
  slot_stride_ = (large_input_at_ + large + 127) & ~size_t(127);
  size_t page = size_t(sysconf(_SC_PAGESIZE));
  arena_size_ = (size_t(nslots_) * slot_stride_ + page - 1) / page * page;
  // Reserved, not committed: grow() makes slots usable as the pool needs
  // them, so only slots ever in use at once cost memory (or commit charge).
  void *mem = mmap(nullptr, arena_size_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mem == MAP_FAILED) {
    arena_ = nullptr;
    return set_error(CHI_ERR_NOMEM, "cannot reserve %zu bytes of address space for %u task slots",
                     arena_size_, nslots_);
  }
  arena_ = static_cast<uint8_t *>(mem);
  free_.init(nslots_, kFreeShards);
  links_.allocate(nslots_);
  // A power of two (the ring of a thread is a mask away), at most one per worker.
  nrings_ = 1;
  while (nrings_ * 2 <= std::min(cfg_.workers, kMaxSharedRings)) nrings_ *= 2;
  run_.reset(new RunQueue[nrings_]);
  for (uint32_t i = 0; i < nrings_; ++i)
    run_[i].init(ring_cells(nslots_, std::max(kMinSharedRingCells, kSharedRingCells / nrings_)), &links_[0]);
  local_.reset(new RunQueue[cfg_.workers]);
  for (uint32_t i = 0; i < cfg_.workers; ++i)
    local_[i].init(ring_cells(nslots_, kWorkerRingCells), &links_[0]);
  uint32_t n = cfg_.workers;
  // At most half the CPUs spin idle: with more spinners than cores, the
  // spinning workers and the threads that submit and wait time-slice, and a
  // round trip costs a scheduler tick instead of a cache-line transfer.  And
  // at most kDefaultMaxSpinners by default: one spinner watches the queues
  // and the rest only stand by, so on a 16-CPU host 4 spinners gave one
  // pipelining thread the throughput of 8 at two thirds of the CPU time,
  // and 16 submitters as much or more (lab/journal/cpu-engine.md).
  unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  max_spinners_ = std::max(1u, std::min(n, cfg_.worker_spinners ? cfg_.worker_spinners
                                                                : std::min(cpus / 2, kDefaultMaxSpinners)));
  // Measured on a 16-CPU host with 16 workers and 16 submitters: taking up
  // to 4 tasks of a shared queue at once took 'cpu->cpu batched x16' from
  // 8.6-12.3 to 13-17 M tasks/s and its p99 from 4 ms to 0.6-3.7 ms; on 2
  // CPUs it cost the pipelined rows (lab/journal/cpu-engine.md).
  pop_batch_ = cfg_.worker_pop_batch ? cfg_.worker_pop_batch : cpus >= 16 ? 4u : 1u;
  workers_.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    if (chi_status_t s = start_worker(i); s != CHI_OK) {
      std::string why = last_error();
      shutdown();
      return set_error(s, "%s", why.c_str());
    }
  }
  return CHI_OK;
}

void CpuExecutor::shutdown() {
  if (workers_.empty()) return;
  stopping_.store(true, std::memory_order_seq_cst);
  idle_seq_.fetch_add(1, std::memory_order_seq_cst);
  futex_wake(&idle_seq_);
  for (pthread_t t : workers_) pthread_join(t, nullptr);
  workers_.clear();
  trace::report();
}

CpuExecutor::Slot *CpuExecutor::slot_at(uint32_t index) const {
  return reinterpret_cast<Slot *>(arena_ + size_t(index) * slot_stride_ + kSmallInput);
}

uint8_t *CpuExecutor::output_of(uint32_t index) const {
  return arena_ + size_t(index) * slot_stride_ + kSmallInput + sizeof(Slot);
}

uint8_t *CpuExecutor::input_of(uint32_t index, size_t size) const {
  uint8_t *base = arena_ + size_t(index) * slot_stride_;
  return size <= RunQueue::kInline ? base : base + large_input_at_;
}

uint8_t *CpuExecutor::input_dst(void *self, uint32_t slot) {
  return static_cast<CpuExecutor *>(self)->input_of(slot, RunQueue::kInline);
}

void set_submit_never_blocks(bool on) { tls_submit_never_blocks = on; }
bool submit_never_blocks() { return tls_submit_never_blocks; }

bool CpuExecutor::on_worker_thread() const {
  return tls_pool == this;
}

bool CpuExecutor::in_handler() const {
  return tls_pool == this || tls_inline_pool == this;
}

bool CpuExecutor::grow(uint32_t want) {
  std::lock_guard<std::mutex> lock(grow_mu_);
  if (committed_.load(std::memory_order_relaxed) >= want) return true;
  size_t bytes = std::min(arena_size_, std::max(committed_bytes_ * 2, kMinCommitBytes));
  // mprotect works in whole pages (arena_size_ is a whole number of them).
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  bytes = std::max(bytes, std::min(arena_size_, (size_t(want) * slot_stride_ + page - 1) / page * page));
  if (mprotect(arena_ + committed_bytes_, bytes - committed_bytes_, PROT_READ | PROT_WRITE) != 0) {
    set_error(CHI_ERR_NOMEM, "cannot commit memory for more CPU task slots (%u in use, %zu bytes): %s",
              committed_.load(std::memory_order_relaxed), bytes, strerror(errno));
    return false;
  }
  committed_bytes_ = bytes;
  uint32_t slots = uint32_t(std::min<size_t>(nslots_, bytes / slot_stride_));
  committed_.store(slots, std::memory_order_release);  // the pages are usable: publish them
  log(LogLevel::kDebug, "CPU task slots committed: %u of %u (%zu bytes)", slots, nslots_, bytes);
  return true;
}

CpuExecutor::Take CpuExecutor::try_acquire(uint32_t *index) {
  // Recycled slots first, this thread's own shard before the others: a slot
  // never used before costs fresh memory.
  if (free_.pop(thread_index() % kFreeShards, index, &tls_free_hint)) return Take::kGot;
  // No slot to recycle: one never used before, committing memory for more.
  bool no_memory = false;
  if (take_fresh(1, index, &no_memory)) return Take::kGot;
  return no_memory ? Take::kNoMemory : Take::kFull;
}

uint32_t CpuExecutor::take_fresh(uint32_t want, uint32_t *out, bool *no_memory) {
  uint32_t got = 0;
  uint32_t f = fresh_.load(std::memory_order_relaxed);
  while (got < want && f < nslots_) {
    const uint32_t c = committed_.load(std::memory_order_acquire);
    if (f >= c) {
      // grow() leaves the message for the caller to report.
      if (!grow(std::min(nslots_, f + (want - got)))) {
        *no_memory = true;
        break;
      }
      f = fresh_.load(std::memory_order_relaxed);
      continue;
    }
    const uint32_t k = std::min(want - got, c - f);
    if (fresh_.compare_exchange_weak(f, f + k, std::memory_order_relaxed)) {
      for (uint32_t j = 0; j < k; ++j) out[got++] = f + j;
      f += k;
    }
  }
  return got;
}

chi_status_t CpuExecutor::acquire_slot(uint32_t *index, bool may_block) {
  Take t = try_acquire(index);
  if (t == Take::kGot) return CHI_OK;
  if (t == Take::kNoMemory) return CHI_ERR_NOMEM;  // grow() said why
  if (!may_block) return set_error(CHI_ERR_AGAIN, "all %u CPU task slots are in use", nslots_);
  int64_t deadline = now_ns() + int64_t(cfg_.submit_timeout_ms) * 1000000;
  for (;;) {
    int64_t spin_end = now_ns() + cfg_.spin_ns;
    const uint32_t shard = thread_index() % kFreeShards;
    do {
      if (free_.pop(shard, index, &tls_free_hint)) return CHI_OK;
      cpu_relax();
    } while (now_ns() < spin_end);
    free_waiters_.fetch_add(1, std::memory_order_seq_cst);
    uint32_t seq = free_seq_.load(std::memory_order_seq_cst);
    bool got = free_.pop(shard, index, &tls_free_hint);
    if (!got) {
      int64_t left = deadline - now_ns();
      if (left > 0) futex_wait(&free_seq_, seq, left);
      got = free_.pop(shard, index, &tls_free_hint);
    }
    free_waiters_.fetch_sub(1, std::memory_order_relaxed);
    if (got) return CHI_OK;
    if (now_ns() >= deadline)
      return set_error(CHI_ERR_AGAIN, "all %u CPU task slots stayed in use for %u ms", nslots_,
                       cfg_.submit_timeout_ms);
  }
}

void CpuExecutor::free_slot(uint32_t index) {
  Slot *s = slot_at(index);
  slot::set_free(s->state);
  free_.push(thread_index() % kFreeShards, index);
  wake_free_waiters(1);
}

void CpuExecutor::wake_free_waiters(uint32_t n) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (free_waiters_.load(std::memory_order_relaxed) > 0) {
    free_seq_.fetch_add(1, std::memory_order_release);
    futex_wake(&free_seq_, int(n));
  }
}

void CpuExecutor::free_slots(const uint32_t *indices, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) slot::set_free(slot_at(indices[i])->state);
  free_.push_many(thread_index() % kFreeShards, indices, n);
  wake_free_waiters(n);
}

uint32_t CpuExecutor::take_slots(uint32_t want, uint32_t *out) {
  const uint32_t shard = thread_index() % kFreeShards;
  uint32_t got = 0;
  while (got < want) {
    const uint32_t k = free_.pop_many(shard, want - got, out + got, &tls_free_hint);
    if (k == 0) break;
    got += k;
  }
  // Not enough to recycle: slots never used before, a run of them per CAS.
  // A failure to commit memory leaves its message; acquire_slot() reports it.
  bool no_memory = false;
  if (got < want) got += take_fresh(want - got, out + got, &no_memory);
  return got;
}

chi_status_t CpuExecutor::submit_batch(const chi_task_desc_t *tasks, size_t n, uint32_t tag,
                                       chi_future_t *futures, size_t *queued) {
  const bool worker = on_worker_thread();
  const bool may_block = cfg_.submit_blocking && !worker && !submit_never_blocks();
  uint32_t idx[kBatchChunk];
  size_t done = 0;
  chi_status_t st = CHI_OK;
  while (done < n) {
    uint32_t got = take_slots(uint32_t(std::min<size_t>(n - done, kBatchChunk)), idx);
    if (got == 0) {
      // None free now: wait for one (or fail) as chi_submit does.  The tasks
      // taken so far are queued already, so their slots can come back.
      if ((st = acquire_slot(&idx[0], may_block)) != CHI_OK) break;
      got = 1;
    }
    queue_chunk(tasks + done, idx, got, worker, tag, futures + done);
    done += got;
  }
  *queued = done;
  return st;
}

void CpuExecutor::queue_chunk(const chi_task_desc_t *tasks, const uint32_t *indices, uint32_t n,
                              bool worker, uint32_t tag, chi_future_t *futures) {
  QueuedTask q[kBatchChunk];
  const void *in[kBatchChunk];
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t index = indices[i];
    const chi_task_desc_t &t = tasks[i];
    Slot *s = slot_at(index);
    s->sink = nullptr;
    const uint32_t g = slot::begin(s->state);
    fill_slot(index, t.method, t.input, t.input_size);
    q[i] = QueuedTask{index, t.method, uint32_t(t.input_size)};
    in[i] = t.input;
    futures[i] = encode_future(tag, kCpuPool, g, index);
  }
  // Counted before any of them can finish, as submit() does.
  stats_.submitted(n);
  if (worker) {
    for (uint32_t i = 0; i < n; ++i)
      local_[tls_worker].push(q[i], in[i], input_of(q[i].slot, q[i].input_size));
  } else {
    push_shared_many(q, in, n);
  }
  notify_worker();
}

void CpuExecutor::push_shared_many(const QueuedTask *tasks, const void *const *inputs, uint32_t n) {
  // The thread's own queue takes as many as it has cells for in one claim;
  // the rest go as single tasks do (the next queues, else a spill).
  uint32_t k = run_[thread_index() & (nrings_ - 1)].try_push_many(tasks, inputs, n);
  for (; k < n; ++k) push_shared(tasks[k], inputs[k], input_of(tasks[k].slot, tasks[k].input_size));
}

chi_status_t CpuExecutor::submit(chi_method_t method, const void *input, size_t input_size,
                                 uint32_t *slot, uint32_t *gen) {
  trace::note(trace::kSubmit);
  if (input_size > payload_)
    return set_error(CHI_ERR_TOO_LARGE, "input of %zu bytes over max_inline_payload %zu",
                     input_size, payload_);
  bool worker = on_worker_thread();
  uint32_t index;
  // A handler never blocks for a slot: the slots it would wait for may be
  // held by tasks that only its own progress completes.
  if (chi_status_t st = acquire_slot(&index, cfg_.submit_blocking && !worker && !submit_never_blocks()); st != CHI_OK)
    return st;
  Slot *s = slot_at(index);
  s->sink = nullptr;
  const uint32_t g = slot::begin(s->state);
  stats_.submitted();
  queue_task(index, method, input, input_size, worker);
  trace::note(trace::kQueued);
  trace::keep(trace::kSubmit, trace::kQueued, index, g);
  *slot = index;
  *gen = g;
  return CHI_OK;
}

chi_status_t CpuExecutor::submit_remote(chi_method_t method, const void *input, size_t input_size,
                                        RemoteSink *sink, uint64_t cookie, uint32_t *slot,
                                        uint32_t *gen) {
  if (input_size > payload_)
    return set_error(CHI_ERR_TOO_LARGE, "input of %zu bytes over max_inline_payload %zu",
                     input_size, payload_);
  uint32_t index;
  if (chi_status_t st = acquire_slot(&index, false); st != CHI_OK) return st;
  Slot *s = slot_at(index);
  s->sink = sink;
  s->cookie = cookie;
  // kRemote: no future names this slot, so chi_wait/test/release refuse it.
  const uint32_t g = slot::begin(s->state, slot::kRemote);
  if (slot) *slot = index;
  if (gen) *gen = g;
  queue_task(index, method, input, input_size, on_worker_thread());
  return CHI_OK;
}

bool CpuExecutor::cancel_remote(uint32_t index, uint32_t gen) {
  if (index >= committed_.load(std::memory_order_acquire)) return false;
  return slot::leave_queue(slot_at(index)->state, gen, slot::kRemoteCancelled);
}

void CpuExecutor::fill_slot(uint32_t index, chi_method_t method, const void *input, size_t input_size) {
  Slot *s = slot_at(index);
  s->method = method;
  // Remote tasks are timed by the server that took them.
  s->submit_ns = !s->sink && RouteStats::sample() ? now_ns() : 0;
  if (input_size > RunQueue::kInline) std::memcpy(input_of(index, input_size), input, input_size);
}

void CpuExecutor::queue_task(uint32_t index, chi_method_t method, const void *input,
                             size_t input_size, bool worker) {
  fill_slot(index, method, input, input_size);
  // Never full: a queue holds at most nslots_ entries.  The push publishes the
  // slot.
  QueuedTask task{index, method, uint32_t(input_size)};
  if (worker)
    local_[tls_worker].push(task, input, input_of(index, input_size));
  else
    push_shared(task, input, input_of(index, input_size));
  notify_worker();
}

void CpuExecutor::push_shared(const QueuedTask &task, const void *input, uint8_t *slot_input) {
  const uint32_t home = thread_index() & (nrings_ - 1);
  // The thread's own queue; when it is full or held up by a descheduled
  // consumer, the next ones.  Only when every ring refuses does the task
  // spill (a backlog of thousands of tasks), into its own queue's list.
  for (uint32_t k = 0, r = home; k < nrings_; ++k, r = r + 1 == nrings_ ? 0 : r + 1)
    if (run_[r].try_push(task, input)) return;
  run_[home].spill(task, input, slot_input);
}

uint32_t CpuExecutor::slots_in_use() const {
  uint32_t n = 0;
  const uint32_t used = std::min(fresh_.load(std::memory_order_acquire), nslots_);
  for (uint32_t i = 0; i < used; ++i)
    n += slot::state_of(slot_at(i)->state.load(std::memory_order_relaxed)) != slot::kFree;
  return n;
}

// Wakes a sleeping worker unless one is already spinning on the queues (a
// spinning worker will take the task, and a futex wake costs microseconds)
// or a wake is already under way (wake_pending_: the woken worker looks at
// the queues once it runs; worker_main's sleep says why nothing is missed).
void CpuExecutor::notify_worker() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  // sleepers_ first: it rarely changes, so its line stays shared and cheap.
  if (sleepers_.load(std::memory_order_seq_cst) == 0) return;
  if (spinning(1) > 0) return;
  // Only the caller that flips the flag 0 -> 1 wakes.  The plain load first:
  // while a wake is under way the line stays shared, not taken by an RMW.
  if (wake_pending_.load(std::memory_order_relaxed) != 0 ||
      wake_pending_.exchange(1, std::memory_order_seq_cst) != 0)
    return;
  idle_seq_.fetch_add(1, std::memory_order_release);
  futex_wake(&idle_seq_, 1);
}

uint32_t CpuExecutor::spinning(uint32_t limit, uint32_t skip) const {
  const uint32_t m = std::min(cfg_.workers, kSpinFlags);
  uint32_t n = 0;
  for (uint32_t i = 0; i < m && n < limit; ++i)
    if (i != skip) n += spinning_[i].load(std::memory_order_seq_cst);
  return n;
}

void CpuExecutor::run_task(const QueuedTask &task) {
  const uint32_t index = task.slot;
  Slot *s = slot_at(index);
  if (s->sink) {
    // A client's task: started here, unless it was cancelled while queued.
    const uint32_t gen = slot::gen_of(s->state.load(std::memory_order_relaxed));
    if (!slot::leave_queue(s->state, gen, slot::kRemoteRunning)) {
      s->sink = nullptr;
      free_slot(index);
      return;
    }
  }
  size_t out_size = 0;
  trace::note(trace::kHandlerStart);
  chi_status_t st = run_cpu_handler(reg_, task.method, CHI_ROUTE_CPU, input_of(index, task.input_size),
                                    task.input_size, output_of(index), payload_, &out_size);
  trace::note(trace::kHandlerEnd);
  if (RemoteSink *sink = s->sink) {
    s->sink = nullptr;
    sink->complete(s->cookie, st, output_of(index), out_size);
    free_slot(index);
    return;
  }
  stats_.finished(st, s->submit_ns ? now_ns() - s->submit_ns : -1);
  s->status = st;
  // Release: a waiter that reads this size before its claim and then sees
  // its own task's done word again knows the size was its task's (take()).
  s->output_size.store(uint32_t(out_size), std::memory_order_release);
  const uint32_t gen = slot::gen_of(s->state.load(std::memory_order_relaxed));
  if (slot::publish(s->state, gen) == slot::kOrphan) free_slot(index);
  trace::note(trace::kPublished);
  trace::keep(trace::kPopped, trace::kPublished, index, gen);
}

// Application threads' queues, this worker's own first, except on one pop in
// kRotateEvery, which starts at the next queue in turn: a worker busy with
// its own queue still visits every other one, so a queue whose workers are
// all held up in long handlers is not left behind for long.
uint32_t CpuExecutor::first_ring(bool worker) const {
  uint32_t first = worker ? tls_worker & (nrings_ - 1) : 0;
  if (++tls_pops % kRotateEvery == 0) first = (first + tls_pops / kRotateEvery) & (nrings_ - 1);
  return first;
}

bool CpuExecutor::pop_batch(RunQueue &q, QueuedTask *task) {
  QueuedTask got[RunQueue::kMaxPopMany];
  const uint32_t n = q.pop_many(got, pop_batch_, input_dst, this);
  if (n == 0) return false;
  // The rest stay with this worker, its next pops (tls_held).  Queued on
  // its own queue instead, so that idle workers could steal them, they cost
  // most of the gain (H200, lab/journal/cpu-engine.md).
  for (uint32_t i = 1; i < n; ++i) tls_held[i - 1] = got[i];
  tls_held_next = 0;
  tls_held_end = n - 1;
  *task = got[0];
  return true;
}

bool CpuExecutor::pop_task(QueuedTask *task, bool own_only, bool batch) {
  const bool worker = on_worker_thread();
  if (worker && tls_held_next < tls_held_end) {
    *task = tls_held[tls_held_next++];
    return true;
  }
  if (worker && local_[tls_worker].pop(task, input_dst, this)) return true;
  if (own_only) return false;
  batch = batch && worker && pop_batch_ > 1;
  const uint32_t first = first_ring(worker);
  for (uint32_t k = 0, r = first; k < nrings_; ++k, r = r + 1 == nrings_ ? 0 : r + 1) {
    if (batch && pop_batch(run_[r], task)) return true;
    if (run_[r].pop(task, input_dst, this)) return true;  // the spill list, or the only pop
  }
  // Steal children that busy handlers queued on their own workers.
  uint32_t n = cfg_.workers, start = worker ? tls_worker + 1 : 0;
  for (uint32_t k = 0; k < n; ++k) {
    uint32_t w = (start + k) % n;
    if (local_[w].pop(task, input_dst, this)) return true;
  }
  return false;
}

bool CpuExecutor::pop_home(QueuedTask *task) {
  return run_[thread_index() & (nrings_ - 1)].pop(task, input_dst, this);
}

bool CpuExecutor::any_task(uint32_t from, uint32_t *ring) const {
  for (uint32_t k = 0, r = from & (nrings_ - 1); k < nrings_; ++k, r = r + 1 == nrings_ ? 0 : r + 1)
    if (run_[r].maybe_nonempty()) {
      if (ring) *ring = r;
      return true;
    }
  const uint32_t n = cfg_.workers;
  for (uint32_t k = 0, w = from % n; k < n; ++k, w = w + 1 == n ? 0 : w + 1)
    if (local_[w].maybe_nonempty()) {
      if (ring) *ring = nrings_;
      return true;
    }
  return false;
}

void CpuExecutor::worker_main(unsigned id) {
  pthread_setname_np(pthread_self(), "chi-worker");  // for top and per-thread CPU figures
  tls_pool = this;
  tls_worker = id;
  uint32_t streak = 0;  // pops in a row that found a task
  const uint32_t me = id % kSpinFlags;
  std::atomic<uint8_t> &flag = spinning_[me];
  bool watching = false;  // this worker holds watcher_
  uint32_t seen = nrings_;  // the shared queue the spin saw a task in
  for (;;) {
    QueuedTask task;
    // After a spin, the queue it saw the task in first: the scan from this
    // worker's own queues on costs a few lines per empty queue.
    bool got = seen < nrings_ && run_[seen].pop(&task, input_dst, this);
    seen = nrings_;
    if (!got) got = pop_task(&task, false, streak > 0);
    if (got) trace::note(trace::kPopped);
    // The watch goes to another spinner once this worker has its task (or
    // found none after all), so that the next spinner does not chase the
    // same one.
    if (watching) {
      watcher_.store(0, std::memory_order_release);
      watching = false;
    }
    // The worker's own loop takes several tasks of a shared queue at once
    // (worker_pop_batch: one claim of its head) once its last pop found one
    // too: the first pop after an idle spell takes one, so a lone task does
    // not pay for the look at the cells behind it (another core's lines); a
    // waiting handler's help takes one at a time.
    if (got) {
      ++streak;
      // Submitters skip the wake while some worker spins.  This worker has
      // just stopped spinning (its flag cleared and fenced before the pop):
      // if more work is queued and no one else spins, it passes the wake
      // on, or that work would wait behind a long handler while sleepers
      // sleep.  A submitter that saw the flag still set queued its task
      // before this look (both sides fence between their write and their
      // read).  With nobody asleep there is no one to wake, and a worker
      // that goes to sleep later looks at the queues after it says so:
      // the queues are read only when someone sleeps, and from this
      // worker's own first (16 workers all reading one queue's head after
      // every task took 0.5 us a task on the 16-CPU host, lab/journal/cpu-engine.md).
      // Nor while another worker spins: it takes that work, and it leaves
      // the spin through a look of its own, with a task (this branch) or
      // towards sleep.  Of workers leaving together, each clears its flag
      // and fences before it reads the others', so the last to read sees
      // every other flag clear and looks.  The look read the tail of the
      // queue just popped, a line the submitter had written: 0.1-0.25 us
      // of a lone task's round trip on the 16-CPU host.  And notify_worker
      // skips the wake while one is under way (wake_pending_): the worker
      // woken looks at the queues once it runs.
      if (sleepers_.load(std::memory_order_seq_cst) != 0 && spinning(1, me) == 0 && any_task(tls_worker))
        notify_worker();
      run_task(task);
      continue;
    }
    streak = 0;
    // Enough workers spin already: straight to the sleep protocol.  Workers
    // that pass the first look together each count the others after their
    // own flag is set: both sides seq_cst, so of any two the later count
    // sees the other, and at most max_spinners_ stay.
    bool spin = spinning(max_spinners_) < max_spinners_;
    if (spin) {
      flag.store(1, std::memory_order_seq_cst);
      spin = spinning(max_spinners_, me) < max_spinners_;
      if (!spin) flag.store(0, std::memory_order_seq_cst);
    }
    if (spin) {
      bool found = false;
      int64_t spin_end = now_ns() + cfg_.spin_ns;
      // One spinner, the watcher, looks at the queues all the time; the
      // others watch watcher_ (a line written only when the watch changes
      // hands) and take the watch when it is free, so a task's queue lines
      // are read by one other core, not by every spinner, and a spinner
      // replaces the watcher that left with a task without a futex wake.
      // They look at the queues themselves every kSpinnerLookEvery polls,
      // so a watcher descheduled while it holds the watch delays tasks by
      // that much, not by a time slice.
      for (unsigned polls = 1;; ++polls) {
        if (!watching && watcher_.load(std::memory_order_relaxed) == 0) {
          uint32_t none = 0;
          watching = watcher_.compare_exchange_strong(none, id + 1, std::memory_order_acquire,
                                                      std::memory_order_relaxed);
        }
        if ((watching || polls % kSpinnerLookEvery == 0) && any_task(0, &seen)) {
          found = true;
          break;
        }
        if (polls % slot::kPollsPerClockRead == 0 && now_ns() >= spin_end) break;
        cpu_relax();
      }
      if (found) {
        // Cleared with a plain store; the fence then waits for its line (the
        // submitters read it), where a shared count's RMW waited for its own.
        // Cleared after the pop instead, the look for more work below could
        // miss a task whose submitter saw the flag still set, and that task
        // would wait for this worker's handler however long it ran.
        flag.store(0, std::memory_order_relaxed);
        std::atomic_thread_fence(std::memory_order_seq_cst);
        continue;
      }
      if (watching) {
        watcher_.store(0, std::memory_order_release);
        watching = false;
      }
      flag.store(0, std::memory_order_seq_cst);
    }
    // Sleep: the flag cleared, announce it, then re-check, so a producer
    // either sees us spinning or asleep, or we see its task (both sides
    // fence between their write and their read).
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    uint32_t seq = idle_seq_.load(std::memory_order_seq_cst);
    // One wake under way at a time (wake_pending_): a submitter (or a look
    // after a pop) that finds the flag set skips its wake.  Its task is not
    // missed.  It read the flag after its fence; a clear that comes after
    // the set it read is followed by the clearer's fence and a look at the
    // queues (here the one below, after futex_wait the pop at the top of the
    // loop), so its fence is ordered after the submitter's and that look
    // sees the task (or its taker did).  And a set is always followed by
    // such a clear while anyone sleeps: the waker bumps idle_seq_ after it,
    // so a worker that read seq before the bump finds the word changed in
    // futex_wait or is asleep when the waker's futex_wake comes, which wakes
    // it or another sleeper, and each clears once futex_wait returns; one
    // that reads seq after the bump clears here, after the set.  A set
    // stays uncleared only while no worker sleeps on idle_seq_, and then the
    // skipped wake would have found nobody either: the workers are awake,
    // and a pop of theirs takes the task, or the look of the next one to
    // sleep, which clears first.  Cleared after the seq read, not before: a
    // set between the two whose bump this read saw would have no clear after
    // it (this worker's futex_wait does not return for that bump), and the
    // tasks of the submitters that skipped would wait, this worker asleep,
    // for some busy worker's next pop.
    wake_pending_.store(0, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (any_task()) {
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
      continue;
    }
    if (stopping_.load(std::memory_order_acquire)) {
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
      break;
    }
    futex_wait(&idle_seq_, seq, -1);
    // Woken (or the word had changed): clear again, fenced before the pop at
    // the top of the loop, so that later submitters wake another worker
    // while this one may still wait for a CPU, and a submitter that skipped
    // its wake on the set that woke this worker has its task seen by that
    // pop (the argument above).
    wake_pending_.store(0, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
  }
  log(LogLevel::kDebug, "CPU worker %u stopped", id);
  tls_pool = nullptr;
}

chi_status_t CpuExecutor::check(uint32_t slot, uint32_t gen) const {
  // Slots past the committed ones were never handed out (and are not mapped).
  if (slot >= committed_.load(std::memory_order_acquire))
    return set_error(CHI_ERR_INVALID, "unknown future (slot %u)", slot);
  if (!slot::live(slot_at(slot)->state.load(std::memory_order_acquire), gen))
    return set_error(CHI_ERR_INVALID, "stale future: already waited on, released or unknown");
  return CHI_OK;
}

chi_status_t CpuExecutor::wait_done(uint32_t slot, uint32_t gen, int64_t timeout_ns, int64_t since_ns,
                                    uint32_t *word) {
  if (chi_status_t s = check(slot, gen); s != CHI_OK) return s;
  Slot *s = slot_at(slot);
  uint32_t w = s->state.load(std::memory_order_acquire);
  // Finished already (the common case in a batch past its first task): no
  // wait set-up, no clock read.
  if (w != slot::word(gen, slot::kDone)) {
    int64_t left = timeout_ns;
    if (timeout_ns > 0 && since_ns) left = std::max<int64_t>(0, timeout_ns - (now_ns() - since_ns));
    // A worker waiting on a task helps run the queue, so a pool whose every
    // worker waits on nested tasks still makes progress; it re-checks the
    // queue every ms while it sleeps.  With inline_wait an application
    // thread helps too, from its own thread's queue only (where its task
    // went), so a task no worker has taken yet runs on the waiter instead
    // of waiting for one (docs/threading.md, "Inline waits").
    const bool worker = on_worker_thread();
    slot::WaitPolicy p;
    p.spin_ns = cfg_.spin_ns;
    p.helper = worker || cfg_.inline_wait;
    if (p.helper) p.slice_ns = 1000000;
    const bool own_only = tls_help_depth >= kMaxHelpDepth;
    auto help = [&] {
      QueuedTask task;
      if (!p.helper) return false;
      // An application thread looks only while no worker spins: a spinner
      // takes the task within a cache-line transfer, and the waiter's pop
      // attempts would pull the queue's head line away from it.  With every
      // worker busy or asleep (a futex wake: tens of us) the waiter runs it.
      if (worker ? !pop_task(&task, own_only) : own_only || spinning(1) > 0 || !pop_home(&task)) return false;
      ++tls_help_depth;
      if (worker) {
        run_task(task);
      } else {
        // A handler never blocks for a slot (submit), nor finalizes its
        // runtime (in_handler); on this thread either.
        const bool never_blocks = tls_submit_never_blocks;
        const void *inline_pool = tls_inline_pool;
        tls_submit_never_blocks = true;
        tls_inline_pool = this;
        run_task(task);
        tls_submit_never_blocks = never_blocks;
        tls_inline_pool = inline_pool;
      }
      --tls_help_depth;
      return true;
    };
    if (slot::wait(s->state, gen, left, p, [] { return false; }, help, [] { return true; }, &w) != CHI_OK)
      return set_error(CHI_ERR_TIMEOUT, "task not finished within %lld ns", (long long)timeout_ns);
    if (w != slot::word(gen, slot::kDone))
      return set_error(CHI_ERR_INVALID, "stale future: already waited on or released");
  }
  trace::note(trace::kSeen);
  *word = w;
  return CHI_OK;
}

chi_status_t CpuExecutor::take(uint32_t slot, uint32_t gen, int64_t timeout_ns, int64_t since_ns,
                               void *output, size_t output_capacity, size_t *output_size,
                               chi_status_t *status) {
  uint32_t w = 0;
  if (chi_status_t st = wait_done(slot, gen, timeout_ns, since_ns, &w); st != CHI_OK) return st;
  Slot *s = slot_at(slot);
  if (output) {
    // CHI_ERR_TOO_LARGE leaves the future valid, so the size is looked at
    // before the claim; it is this task's only if the word still says
    // done(gen) after it (else another thread consumed the future and the
    // slot may hold the next task).
    const size_t need = s->output_size.load(std::memory_order_acquire);
    if (output_capacity < need) {
      if (s->state.load(std::memory_order_acquire) != w)
        return set_error(CHI_ERR_INVALID, "stale future: consumed by another thread");
      if (output_size) *output_size = need;
      return set_error(CHI_ERR_TOO_LARGE, "output of %zu bytes does not fit a %zu-byte buffer", need,
                       output_capacity);
    }
  }
  if (!slot::claim(s->state, w)) return set_error(CHI_ERR_INVALID, "stale future: consumed by another thread");
  // Claimed: the slot and its result are this thread's.
  const size_t size = s->output_size.load(std::memory_order_relaxed);
  *status = s->status;
  if (output && size) std::memcpy(output, output_of(slot), size);
  if (output_size) *output_size = size;
  return CHI_OK;
}

chi_status_t CpuExecutor::wait(uint32_t slot, uint32_t gen, int64_t timeout_ns, void *output,
                               size_t output_capacity, size_t *output_size) {
  trace::note(trace::kWait);
  chi_status_t status;
  if (chi_status_t s = take(slot, gen, timeout_ns, 0, output, output_capacity, output_size, &status);
      s != CHI_OK) {
    trace::keep(trace::kWait, trace::kReturned, slot, gen);  // no stamp left for the next wait
    return s;
  }
  const chi_method_t method = slot_at(slot)->method;
  free_slot(slot);
  trace::note(trace::kReturned);
  trace::keep(trace::kWait, trace::kReturned, slot, gen);
  if (status != CHI_OK) set_error(status, "handler of method %u returned %d", method, status);
  return status;
}

chi_status_t CpuExecutor::wait_batch(const chi_future_t *futures, size_t n, int64_t timeout_ns,
                                     int64_t since_ns, chi_task_result_t *results, size_t *done) {
  uint32_t taken[kBatchChunk];
  uint32_t ntaken = 0;
  chi_status_t st = CHI_OK;
  size_t i = 0;
  // The last task first: meanwhile the workers finish the ones before it
  // without this thread polling the very slot lines they publish into.  A
  // poll per task in order made each publish a contended CAS: batches of 64
  // echoes from one thread to one worker on the 2-core VM went from 3.9 to
  // 6.3 M tasks/s with this.  Whatever it returns, the loop below takes the
  // results in order and reports the first that is missing.
  if (n > 1) {
    FutureParts last{};
    uint32_t w = 0;
    if (decode_future(futures[n - 1], &last)) (void)wait_done(last.slot, last.gen, timeout_ns, since_ns, &w);
  }
  for (; i < n; ++i) {
    FutureParts p{};
    decode_future(futures[i], &p);
    chi_task_result_t &r = results[i];
    if ((st = take(p.slot, p.gen, timeout_ns, since_ns, r.output, r.output_capacity, &r.output_size,
                   &r.status)) != CHI_OK) {
      r.status = st;
      break;
    }
    taken[ntaken++] = p.slot;
    if (ntaken == kBatchChunk) {
      free_slots(taken, ntaken);
      ntaken = 0;
    }
  }
  if (ntaken) free_slots(taken, ntaken);
  *done = i;
  return st;
}

chi_status_t CpuExecutor::test(uint32_t slot, uint32_t gen, int *done) {
  if (chi_status_t s = check(slot, gen); s != CHI_OK) return s;
  *done = slot::state_of(slot_at(slot)->state.load(std::memory_order_acquire)) == slot::kDone;
  return CHI_OK;
}

chi_status_t CpuExecutor::release(uint32_t slot, uint32_t gen) {
  if (chi_status_t s = check(slot, gen); s != CHI_OK) return s;
  // An orphan is freed by the worker when it finishes.
  return slot::release(slot_at(slot)->state, gen, [&] { free_slot(slot); });
}

}  // namespace chi
