#include "cpu_routes.h"

#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "cpu_floors.h"
#include "tool_util.h"

namespace chi_bench {
namespace {

// A lost task shows up as a failed row rather than a hung benchmark.
constexpr int64_t kWaitTimeoutNs = 10'000'000'000;
// One task in kSampleEvery is timed in throughput runs: enough samples for a
// p99, few enough clock reads not to slow the submitter down.
constexpr uint64_t kSampleEvery = 16;

// Payload of task `seq` of submitter `who`: distinct per task, so an echo that
// returned another task's bytes is caught.
void make_payload(uint8_t *p, size_t n, uint64_t who, uint64_t seq) {
  for (size_t i = 0; i < n; i++) p[i] = uint8_t(0xA5 ^ (i * 37));
  uint64_t words[2] = {seq, who};
  std::memcpy(p, words, std::min(n, sizeof words));
}

void set_route(chi_bench_row *row, const char *route_name, const chi_bench_options &opt) {
  std::snprintf(row->route, sizeof row->route, "%s", route_name);
  std::snprintf(row->method, sizeof row->method, "chi.echo");
  std::snprintf(row->floor, sizeof row->floor, "%s", kCpuFloor);
  row->payload_bytes = opt.payload;
}

struct Submitter {
  uint64_t who = 0;
  std::vector<uint64_t> samples;
  uint64_t end_ns = 0;
  chi_status_t status = CHI_OK;
  std::string error;

  void failed(chi_status_t st, const char *what) {
    if (status != CHI_OK) return;
    status = st;
    error = std::string(what) + ": " + chi_status_string(st) + ": " + chi_last_error_message();
  }
};

// Runs n tasks with up to `window` outstanding; records sampled latencies when
// `record`.  At the first failure it stops issuing and releases the futures
// still outstanding instead of waiting for each (a lost task would otherwise
// cost a full timeout per future).
void pipeline(chi_runtime_t *rt, chi_route_t route, const chi_bench_options &opt, uint64_t n,
              uint64_t first_seq, bool record, Submitter *s) {
  const uint32_t w = opt.window;
  const size_t size = opt.payload;
  std::vector<chi_future_t> futures(w);
  std::vector<uint64_t> seqs(w), started(w);
  std::vector<uint8_t> in(size ? size : 1), out(size ? size : 1), expect(size ? size : 1);
  uint32_t head = 0, outstanding = 0;
  uint64_t issued = 0;
  bool stop = false;

  while ((issued < n && !stop) || outstanding > 0) {
    if (stop) {
      for (; outstanding > 0; outstanding--, head = (head + 1) % w) chi_release(rt, futures[head]);
      break;
    }
    if (issued < n && outstanding < w) {
      uint64_t seq = first_seq + issued;
      make_payload(in.data(), size, s->who, seq);
      uint32_t at = (head + outstanding) % w;
      uint64_t t0 = (record && seq % kSampleEvery == 0) ? chi_tool_now_ns() : 0;
      chi_future_t f = 0;
      chi_status_t st = chi_submit(rt, route, CHI_METHOD_ECHO, in.data(), size, &f);
      if (st == CHI_OK) {
        futures[at] = f;
        seqs[at] = seq;
        started[at] = t0;
        outstanding++;
        issued++;
        continue;
      }
      // Slots full: collect a result of our own to free one, then retry.
      if (st != CHI_ERR_AGAIN || outstanding == 0) {
        s->failed(st, "chi_submit");
        stop = true;
      }
      if (outstanding == 0) continue;
    }
    size_t got = 0;
    chi_status_t st =
        chi_wait(rt, futures[head], kWaitTimeoutNs, out.data(), out.size(), &got);
    uint64_t t1 = started[head] ? chi_tool_now_ns() : 0;
    if (st != CHI_OK) {
      s->failed(st, "chi_wait");
      if (st == CHI_ERR_TIMEOUT || st == CHI_ERR_TOO_LARGE) chi_release(rt, futures[head]);
      stop = true;
    } else {
      make_payload(expect.data(), size, s->who, seqs[head]);
      if (got != size || std::memcmp(out.data(), expect.data(), size) != 0) {
        if (s->status == CHI_OK) {
          s->status = CHI_ERR_INTERNAL;
          s->error = "chi.echo returned bytes that differ from its input";
        }
        stop = true;
      } else if (t1) {
        s->samples.push_back(t1 - started[head]);
      }
    }
    head = (head + 1) % w;
    outstanding--;
  }
}

// One batch of the batched row: its buffers and what is in flight.
struct Batch {
  std::vector<uint8_t> in, out;
  std::vector<chi_task_desc_t> tasks;
  std::vector<chi_task_result_t> results;
  std::vector<chi_future_t> futures;
  size_t sent = 0;
  uint64_t first = 0;  // seq of its first task
  uint64_t t0 = 0;     // submit time, when one of its tasks is sampled
};

// Runs n tasks in batches of up to `window`, two batches in flight: one
// chi_submit_batch for the next batch, then one chi_wait_batch for the one
// before, so the workers never find the queues empty between batches.  A
// sampled task's latency runs from its batch's submit to the return of its
// wait.  CHI_ERR_AGAIN (slots full) sends the part that went; the rest
// follows in the next batch.
void batched(chi_runtime_t *rt, chi_route_t route, const chi_bench_options &opt, uint64_t n,
             uint64_t first_seq, bool record, Submitter *s) {
  const uint32_t w = opt.window;
  const size_t size = opt.payload;
  const size_t stride = size ? size : 1;
  std::vector<uint8_t> expect(stride);
  Batch b[2];
  for (Batch &x : b) {
    x.in.resize(stride * w);
    x.out.resize(stride * w);
    x.tasks.resize(w);
    x.results.resize(w);
    x.futures.resize(w);
  }
  auto abandon = [&] {
    for (Batch &x : b)
      for (size_t i = 0; i < x.sent; i++) chi_release(rt, x.futures[i]);
  };
  // Waits for batch x and checks its outputs; false on a failure (recorded).
  auto collect = [&](Batch &x) {
    size_t got = 0;
    chi_status_t st = chi_wait_batch(rt, x.futures.data(), x.sent, kWaitTimeoutNs, x.results.data(), &got);
    const uint64_t t1 = x.t0 ? chi_tool_now_ns() : 0;
    if (st != CHI_OK) {
      s->failed(st, "chi_wait_batch");
      for (size_t i = got; i < x.sent; i++) chi_release(rt, x.futures[i]);
      x.sent = 0;
      return false;
    }
    const size_t sent = x.sent;
    x.sent = 0;
    for (size_t i = 0; i < sent; i++) {
      const uint64_t seq = x.first + i;
      make_payload(expect.data(), size, s->who, seq);
      if (x.results[i].status != CHI_OK) {
        s->failed(x.results[i].status, "chi.echo in a batch");
        return false;
      }
      if (x.results[i].output_size != size || std::memcmp(&x.out[i * stride], expect.data(), size) != 0) {
        if (s->status == CHI_OK) {
          s->status = CHI_ERR_INTERNAL;
          s->error = "chi.echo returned bytes that differ from its input";
        }
        return false;
      }
      if (t1 && seq % kSampleEvery == 0) s->samples.push_back(t1 - x.t0);
    }
    return true;
  };

  uint64_t issued = 0;
  for (unsigned cur = 0;; cur ^= 1) {
    Batch &x = b[cur], &prev = b[cur ^ 1];
    if (issued < n) {
      const uint32_t count = uint32_t(std::min<uint64_t>(w, n - issued));
      x.first = first_seq + issued;
      bool sampled = false;
      for (uint32_t i = 0; i < count; i++) {
        make_payload(&x.in[i * stride], size, s->who, x.first + i);
        x.tasks[i] = chi_task_desc_t{CHI_METHOD_ECHO, &x.in[i * stride], size};
        x.results[i] = chi_task_result_t{&x.out[i * stride], stride, 0, CHI_OK};
        sampled = sampled || (record && (x.first + i) % kSampleEvery == 0);
      }
      x.t0 = sampled ? chi_tool_now_ns() : 0;
      chi_status_t st = chi_submit_batch(rt, route, x.tasks.data(), count, x.futures.data(), &x.sent);
      if (st != CHI_OK && (st != CHI_ERR_AGAIN || (x.sent == 0 && prev.sent == 0))) {
        s->failed(st, "chi_submit_batch");
        abandon();
        return;
      }
      issued += x.sent;
    }
    if (prev.sent && !collect(prev)) {
      abandon();
      return;
    }
    if (issued >= n && x.sent == 0 && prev.sent == 0) return;
  }
}

using Runner = void (*)(chi_runtime_t *, chi_route_t, const chi_bench_options &, uint64_t, uint64_t,
                        bool, Submitter *);

// `threads` submitters, each running `run` for its share after an untimed warm-up.
void throughput_row(chi_runtime_t *rt, chi_route_t route, const char *name, const char *route_name,
                    uint32_t threads, const chi_bench_options &opt, Runner run, chi_bench_row *row) {
  chi_bench_row_init(row, name, CHI_BENCH_THROUGHPUT);
  set_route(row, route_name, opt);
  row->threads = threads;
  row->window = opt.window;
  row->target_throughput = kCpuTargetThroughput;

  std::vector<Submitter> subs(threads);
  std::atomic<uint32_t> ready{0};
  std::atomic<bool> go{false};
  const uint64_t share = opt.tput_tasks / threads;
  const uint64_t warm = std::max<uint64_t>(opt.warmup / threads, 2ull * opt.window);
  std::vector<std::thread> pool;
  for (uint32_t t = 0; t < threads; t++) {
    subs[t].who = t + 1;
    subs[t].samples.reserve(share / kSampleEvery + 1);
    pool.emplace_back([&, t] {
      Submitter *s = &subs[t];
      if (opt.pin) chi_tool_pin_thread(t);
      run(rt, route, opt, warm, 0, false, s);
      ready.fetch_add(1, std::memory_order_acq_rel);
      while (!go.load(std::memory_order_acquire)) sched_yield();
      if (s->status == CHI_OK) run(rt, route, opt, share, warm, true, s);
      s->end_ns = chi_tool_now_ns();
    });
  }
  while (ready.load(std::memory_order_acquire) < threads) sched_yield();
  struct rusage u0 {}, u1 {};
  const bool have_usage = getrusage(RUSAGE_SELF, &u0) == 0;
  uint64_t t0 = chi_tool_now_ns();
  go.store(true, std::memory_order_release);
  for (auto &th : pool) th.join();
  const bool usage = have_usage && getrusage(RUSAGE_SELF, &u1) == 0;

  uint64_t t1 = t0;
  std::vector<uint64_t> samples;
  for (auto &s : subs) {
    t1 = std::max(t1, s.end_ns);
    samples.insert(samples.end(), s.samples.begin(), s.samples.end());
    if (s.status != CHI_OK && row->status == CHI_OK)
      chi_bench_row_fail(row, s.status, "submitter %llu: %s",
                         static_cast<unsigned long long>(s.who), s.error.c_str());
  }
  if (row->status != CHI_OK) return;
  chi_bench_row_samples(row, samples.data(), samples.size());
  row->count = share * threads;
  row->throughput = t1 > t0 ? double(row->count) * 1e9 / double(t1 - t0) : NAN;
  if (usage && row->count) {
    auto ns = [](const timeval &tv) { return double(tv.tv_sec) * 1e9 + double(tv.tv_usec) * 1e3; };
    const double cpu = ns(u1.ru_utime) + ns(u1.ru_stime) - ns(u0.ru_utime) - ns(u0.ru_stime);
    const double csw = double(u1.ru_nvcsw + u1.ru_nivcsw) - double(u0.ru_nvcsw + u0.ru_nivcsw);
    row->cpu_ns_per_op = cpu / double(row->count);
    row->csw_per_op = csw / double(row->count);
  }
}

// Round trips one at a time: `warmup` untimed, then `n` timed, each after
// `quiet_ns` without work when it is > 0.  Fails the row on the first error.
void round_trips(chi_runtime_t *rt, chi_route_t route, const chi_bench_options &opt, uint64_t warmup,
                 uint64_t n, int64_t quiet_ns, chi_bench_row *row) {
  const size_t size = opt.payload;
  std::vector<uint8_t> in(size ? size : 1), out(size ? size : 1);
  std::vector<uint64_t> samples;
  samples.reserve(n);
  for (uint64_t i = 0; i < warmup + n; i++) {
    if (quiet_ns > 0) {
      timespec ts{time_t(quiet_ns / 1000000000), long(quiet_ns % 1000000000)};
      nanosleep(&ts, nullptr);
    }
    make_payload(in.data(), size, 0, i);
    chi_future_t f = 0;
    size_t got = 0;
    uint64_t t0 = chi_tool_now_ns();
    chi_status_t st = chi_submit(rt, route, CHI_METHOD_ECHO, in.data(), size, &f);
    if (st != CHI_OK) {
      chi_bench_row_fail(row, st, "chi_submit: %s: %s", chi_status_string(st),
                         chi_last_error_message());
      return;
    }
    st = chi_wait(rt, f, kWaitTimeoutNs, out.data(), out.size(), &got);
    uint64_t t1 = chi_tool_now_ns();
    if (st != CHI_OK) {
      chi_bench_row_fail(row, st, "chi_wait: %s: %s", chi_status_string(st),
                         chi_last_error_message());
      if (st == CHI_ERR_TIMEOUT || st == CHI_ERR_TOO_LARGE) chi_release(rt, f);
      return;
    }
    if (got != size || std::memcmp(out.data(), in.data(), size) != 0) {
      chi_bench_row_fail(row, CHI_ERR_INTERNAL,
                         "chi.echo returned %zu bytes that differ from its %zu-byte input", got,
                         size);
      return;
    }
    if (i >= warmup) samples.push_back(t1 - t0);
  }
  chi_bench_row_samples(row, samples.data(), samples.size());
}

}  // namespace

void cpu_latency(chi_runtime_t *rt, chi_route_t route, const char *name, const char *route_name,
                 const chi_bench_options &opt, chi_bench_row *row) {
  chi_bench_row_init(row, name, CHI_BENCH_LATENCY);
  set_route(row, route_name, opt);
  row->target_p50_ns = kCpuTargetP50Ns;
  round_trips(rt, route, opt, opt.warmup, opt.iters, 0, row);
}

void cpu_latency_after_quiet(chi_runtime_t *rt, const char *name, int64_t quiet_ns,
                             const chi_bench_options &opt, chi_bench_row *row) {
  chi_bench_row_init(row, name, CHI_BENCH_LATENCY);
  set_route(row, "CHI_ROUTE_CPU", opt);
  row->floor[0] = '\0';  // a wake-up, not a line transfer: no floor of the run fits
  const uint64_t n = std::max<uint64_t>(20, std::min<uint64_t>(opt.iters / 250, 200));
  round_trips(rt, CHI_ROUTE_CPU, opt, 0, n, quiet_ns, row);
}

void cpu_throughput(chi_runtime_t *rt, chi_route_t route, const char *name,
                    const char *route_name, uint32_t threads, const chi_bench_options &opt,
                    chi_bench_row *row) {
  throughput_row(rt, route, name, route_name, threads, opt, pipeline, row);
}

void cpu_batched(chi_runtime_t *rt, chi_route_t route, const char *name, const char *route_name,
                 uint32_t threads, const chi_bench_options &opt, chi_bench_row *row) {
  throughput_row(rt, route, name, route_name, threads, opt, batched, row);
}

}  // namespace chi_bench
