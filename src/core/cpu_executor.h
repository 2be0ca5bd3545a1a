// The CPU worker pool: task slots with inline payloads, MPMC run queues,
// worker threads that spin then sleep on a futex.  Slots are committed as the
// pool first needs them (up to queue_depth), so a deep default costs memory
// only while that many tasks are in flight.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "config/config.h"
#include "core/executor.h"
#include "core/sharded_free_stack.h"
#include "core/run_queue.h"
#include "core/registry.h"
#include "core/stats.h"

namespace chi {

class CpuExecutor final : public Executor {
 public:
  CpuExecutor(const Config &cfg, const Registry &reg, RouteStats &stats);
  ~CpuExecutor() override;
  chi_status_t start();
  // Refuses new tasks, runs the queued ones, joins the workers.
  void shutdown();

  chi_status_t submit(chi_method_t method, const void *input, size_t input_size, uint32_t *slot,
                      uint32_t *gen) override;
  chi_status_t wait(uint32_t slot, uint32_t gen, int64_t timeout_ns, void *output,
                    size_t output_capacity, size_t *output_size) override;
  chi_status_t test(uint32_t slot, uint32_t gen, int *done) override;
  chi_status_t release(uint32_t slot, uint32_t gen) override;

  // chi_submit_batch on this pool, for tasks the caller checked already
  // (method registered, input_size within max_inline_payload, input given):
  // queues them in order, kBatchChunk at a time (one slot take from the free
  // stack, one ring claim and one wake-up decision per chunk), and writes
  // futures[i] of task i with the runtime's tag.  Stops at the first task
  // that gets no slot (CHI_ERR_AGAIN or CHI_ERR_NOMEM, as submit()); *queued
  // says how many went.
  chi_status_t submit_batch(const chi_task_desc_t *tasks, size_t n, uint32_t tag,
                            chi_future_t *futures, size_t *queued);
  // chi_wait_batch for futures of this pool (the caller checked their tag
  // and pool): takes results in order, hands the slots back kBatchChunk at a
  // time, and stops at the first future that gives none (CHI_ERR_TIMEOUT,
  // CHI_ERR_TOO_LARGE, CHI_ERR_INVALID), *done its index.  timeout_ns counts
  // from since_ns (now_ns() at the start of the call).
  chi_status_t wait_batch(const chi_future_t *futures, size_t n, int64_t timeout_ns, int64_t since_ns,
                          chi_task_result_t *results, size_t *done);
  static constexpr uint32_t kBatchChunk = 64;

  // Queues a task whose result goes to sink->complete(cookie, ...) instead of
  // a future.  Never blocks: CHI_ERR_AGAIN when every slot is in use (the
  // caller keeps the request and tries later).  Input is copied once, here.
  // *slot and *gen (may be NULL) name the task for cancel_remote.
  chi_status_t submit_remote(chi_method_t method, const void *input, size_t input_size,
                             RemoteSink *sink, uint64_t cookie, uint32_t *slot = nullptr,
                             uint32_t *gen = nullptr);
  // Cancels a remote task that no worker has started: true when it will
  // never run and its sink is never called (the slot is freed when a worker
  // meets it in the queue); false when it started (or ended) already.
  bool cancel_remote(uint32_t slot, uint32_t gen);
  // Slots held now (queued, running, or done and not yet claimed).
  // A scan of the slot states: for statistics, not for hot paths.
  uint32_t slots_in_use() const;
  // The most slots the pool may hold (queue_depth), committed or not.
  uint32_t slot_count() const { return nslots_; }

  // True on one of this pool's worker threads.
  bool on_worker_thread() const;
  // True inside one of this pool's handlers: on a worker, or on an
  // application thread whose wait runs a queued task (inline_wait).
  bool in_handler() const;

 private:
  struct Slot;
  Slot *slot_at(uint32_t index) const;
  // The input area for an input of `size` bytes.
  uint8_t *input_of(uint32_t index, size_t size) const;
  uint8_t *output_of(uint32_t index) const;
  chi_status_t check(uint32_t slot, uint32_t gen) const;
  void queue_task(uint32_t index, chi_method_t method, const void *input, size_t input_size,
                  bool worker);
  enum class Take { kGot, kFull, kNoMemory };
  Take try_acquire(uint32_t *index);
  // A free slot, recycled or new; CHI_ERR_AGAIN when all nslots_ are in use
  // (after up to submit_timeout_ms when may_block), CHI_ERR_NOMEM when no
  // memory could be committed for more.  Sets the message on failure.
  chi_status_t acquire_slot(uint32_t *index, bool may_block);
  // Commits slot memory until at least `want` slots are usable.
  bool grow(uint32_t want);
  void free_slot(uint32_t index);
  // After slots went back: wakes up to n submitters waiting for one.
  void wake_free_waiters(uint32_t n);
  // free_slot for n slots: one push on the free stack, one waiter check.
  void free_slots(const uint32_t *indices, uint32_t n);
  // Up to want free slots without waiting, recycled first; 0: none now.
  uint32_t take_slots(uint32_t want, uint32_t *out);
  // Up to want slots never used before, a run per CAS, committing memory
  // for more as needed; *no_memory set when that failed (grow() said why).
  uint32_t take_fresh(uint32_t want, uint32_t *out, bool *no_memory);
  // A slot's method, sampled submit time and large input, before it is queued.
  void fill_slot(uint32_t index, chi_method_t method, const void *input, size_t input_size);
  // The tasks of one chunk into their slots and the run queues.
  void queue_chunk(const chi_task_desc_t *tasks, const uint32_t *indices, uint32_t n, bool worker,
                   uint32_t tag, chi_future_t *futures);
  void push_shared_many(const QueuedTask *tasks, const void *const *inputs, uint32_t n);
  // chi_wait up to the copy of the output: CHI_OK once the result is claimed
  // (*status: the task's; the caller frees the slot), else the wait's own
  // failure with its message, the future left valid.  timeout_ns counts
  // from since_ns, or from now when since_ns is 0.
  chi_status_t take(uint32_t slot, uint32_t gen, int64_t timeout_ns, int64_t since_ns, void *output,
                    size_t output_capacity, size_t *output_size, chi_status_t *status);
  // take's wait alone: CHI_OK with *word the state once the task is done,
  // nothing claimed; else CHI_ERR_TIMEOUT or CHI_ERR_INVALID with a message.
  chi_status_t wait_done(uint32_t slot, uint32_t gen, int64_t timeout_ns, int64_t since_ns, uint32_t *word);
  void run_task(const QueuedTask &task);
  // The next task for this thread: a worker's held tasks, its own queue,
  // then (unless own_only) application threads' queues and other workers'
  // queues.  batch: a worker takes up to pop_batch_ tasks of a shared queue
  // at once (its own loop only).
  bool pop_task(QueuedTask *task, bool own_only, bool batch = false);
  // The calling application thread's own run queue only (inline_wait).
  bool pop_home(QueuedTask *task);
  // Queues an application thread's task on its run queue, else another one.
  void push_shared(const QueuedTask &task, const void *input, uint8_t *slot_input);
  static uint8_t *input_dst(void *self, uint32_t slot);
  // Whether some queue may hold a task, looking first at the queues of
  // index `from` (a worker's own, so that workers do not all poll one
  // queue's lines first).  *ring (when given): the shared queue it saw a
  // task in, or nrings_ when that was a worker's own queue.
  bool any_task(uint32_t from = 0, uint32_t *ring = nullptr) const;
  void worker_main(unsigned id);
  static void *worker_entry(void *arg);
  chi_status_t start_worker(unsigned id);
  void notify_worker();
  // Spinning flags set, counting up to `limit`, byte `skip` left out.
  uint32_t spinning(uint32_t limit, uint32_t skip = kSpinFlags) const;
  // The first application-thread queue a pop looks at (pop_task).
  uint32_t first_ring(bool worker) const;
  // A worker: up to pop_batch_ tasks of shared queue q with one claim; the
  // first in *task, the rest held for its next pops (pop_task takes them
  // first).  False: q's ring is empty.
  bool pop_batch(RunQueue &q, QueuedTask *task);

  const Config &cfg_;
  const Registry &reg_;
  RouteStats &stats_;
  uint32_t nslots_;
  size_t payload_;
  static constexpr size_t kSmallInput = 128;  // holds RunQueue::kInline bytes
  static_assert(kSmallInput >= RunQueue::kInline, "small inputs fit their area");
  size_t slot_stride_;
  size_t large_input_at_;  // offset of the large input area in a slot
  uint8_t *arena_ = nullptr;  // slots (header, output, input): reserved, committed by grow()
  size_t arena_size_ = 0;
  std::mutex grow_mu_;
  size_t committed_bytes_ = 0;          // under grow_mu_
  std::atomic<uint32_t> committed_{0};  // slots whose memory is usable
  std::atomic<uint32_t> fresh_{0};      // slots handed out at least once: [0, fresh_)
  ShardedFreeStack free_;  // a shard per group of threads (thread_index())
  ZeroedArray<SpillLink> links_;  // the run queues' spill lists
  // Tasks from application threads: one queue per group of submitting
  // threads (thread_index() % nrings_), each the first choice of some
  // workers, so that submitters and workers do not all meet on one head and
  // one tail, and a consumer descheduled inside a pop holds up one queue,
  // whose producers then use the next.
  std::unique_ptr<RunQueue[]> run_;
  uint32_t nrings_ = 1;  // a power of two
  // Tasks that a handler submits go to its worker's own queue, so that a
  // waiting worker runs its own children first (see wait()).
  std::unique_ptr<RunQueue[]> local_;
  std::vector<pthread_t> workers_;
  std::atomic<bool> stopping_{false};
  alignas(64) std::atomic<uint32_t> idle_seq_{0};   // futex word of idle workers
  // One wake under way at a time.  A waker (notify_worker, after it finds a
  // sleeper and no spinner) wakes only if it flips this 0 -> 1 with an
  // exchange, then bumps idle_seq_ and calls futex_wake; while it is set,
  // submitters and the look after a pop skip their wake, since the worker
  // on its way looks at the queues once it runs.  A sleeper clears it after
  // its read of idle_seq_ and again once futex_wait returns, each time
  // fenced before its next look at the queues, so a task whose submitter
  // saw the flag set is seen by that look (worker_main argues it).  On 2
  // CPUs a woken worker counts in sleepers_ until it gets a CPU,
  // microseconds, and without the flag every submit and every pop in that
  // time made another futex_wake that found nobody (2-core VM, one
  // `chimaera-bench --iters 50000`: 185k futex calls without it, 49k with).
  // The price: a burst after an idle spell wakes sleepers one after another
  // (each woken worker clears the flag, and passes the wake on when it sees
  // more work), not one per submit.  Beside idle_seq_: only wakers, sleepers
  // and shutdown touch either, and submitters read it only when someone
  // sleeps and no one spins.
  std::atomic<uint32_t> wake_pending_{0};
  // Each on its own line: submitters read sleepers_ on every submit, while
  // the spinning flags change with every idle spell of a worker.
  alignas(64) std::atomic<int32_t> sleepers_{0};     // workers asleep on idle_seq_
  // Idle workers spinning (the watcher and those standing by): a byte per
  // worker (worker i: byte i % kSpinFlags).  A worker that finds a task
  // clears its byte with a plain store and a fence before it takes the task
  // (a shared counter's atomic RMW there measured slower on the 2-core VM).
  // Submitters read the bytes after sleepers_ (and before wake_pending_) and
  // skip the wake while one is set.  Two workers of one byte (past 256
  // workers) only cost a needless wake or an extra spinner.
  static constexpr uint32_t kSpinFlags = 256;
  alignas(64) std::atomic<uint8_t> spinning_[kSpinFlags] = {};
  // The spinning worker that looks at the queues (its id + 1; 0: none).  The
  // other spinners wait for the watch (worker_main).
  alignas(64) std::atomic<uint32_t> watcher_{0};
  uint32_t max_spinners_ = 1;                        // more would only steal CPU from producers
  uint32_t pop_batch_ = 1;                           // worker_pop_batch, resolved (1..8)
  alignas(64) std::atomic<uint32_t> free_seq_{0};   // futex word of blocked submitters
  std::atomic<int32_t> free_waiters_{0};
};

}  // namespace chi
