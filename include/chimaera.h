/*
 * chimaera.h -- host C API of the chimaera task runtime.
 *
 * chimaera runs small tasks on CPU worker threads and on a persistent GPU
 * kernel (the orchestrator).  Host code and GPU kernels submit tasks to each
 * other through lock-free queues; every call answers with a chi_status_t and,
 * on failure, a thread-local message (chi_last_error_message).
 *
 * This header is plain C99 and includes no CUDA/HIP header.  Device code uses
 * chimaera_device.h.  Every function is thread-safe on one runtime unless its
 * documentation says otherwise.  Status values are frozen once released.
 */
#ifndef CHIMAERA_H
#define CHIMAERA_H

#include <stddef.h>
#include <stdint.h>

#include "chimaera/config.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define CHI_API
#elif defined(CHI_BUILDING_LIBRARY)
#define CHI_API __attribute__((visibility("default")))
#else
#define CHI_API
#endif

/* ---------------------------------------------------------------- versions */

/* CHI_VERSION_MAJOR, CHI_VERSION_MINOR, CHI_VERSION_PATCH: generated from
 * the build's project(VERSION). */
#include "chimaera/version.h"
/* MAJOR * 10000 + MINOR * 100 + PATCH, comparable with chi_version(). */
#define CHI_VERSION_NUMBER \
  (CHI_VERSION_MAJOR * 10000 + CHI_VERSION_MINOR * 100 + CHI_VERSION_PATCH)

/* Version of the library actually loaded, as CHI_VERSION_NUMBER.
 * Thread safety: safe from any thread, no runtime needed. */
CHI_API uint32_t chi_version(void);

/* The loaded library's version as "MAJOR.MINOR.PATCH" (static storage).
 * Thread safety: safe from any thread. */
CHI_API const char *chi_version_string(void);

/* ------------------------------------------------------------------ types */

typedef int32_t chi_status_t;  /* 0 = CHI_OK, errors < 0                     */
typedef uint64_t chi_future_t; /* 0 is never a valid future                  */
typedef uint32_t chi_method_t; /* 0 is never a valid method                  */
typedef int32_t chi_route_t;   /* >= 0: that GPU                             */

#define CHI_ROUTE_CPU (-1)     /* a CPU worker; from device code: GPU->CPU    */
#define CHI_ROUTE_GPU_ANY (-2) /* any GPU orchestrator the runtime picks      */
#define CHI_ROUTE_LOCAL (-3)   /* where the caller runs: a CPU worker from host
                                  code, the caller's own GPU from a kernel     */
/* GPU number n as a route.  Bindings may simply pass n (routes >= 0). */
#define CHI_ROUTE_GPU(n) ((chi_route_t)(n))

#define CHI_MODE_EMBEDDED 0 /* the runtime lives in this process            */
#define CHI_MODE_CLIENT 1   /* connect to a chimaera-server (see chi_init)     */

/* Built-in methods, registered first by every runtime with these fixed ids,
 * served by the CPU workers and by every GPU orchestrator.
 *   chi.echo      output = input
 *   chi.add       input: two little-endian uint64; output: their uint64 sum
 *   chi.checksum  output: 64-bit FNV-1a of the input bytes (uint64)        */
#define CHI_METHOD_ECHO ((chi_method_t)1)
#define CHI_METHOD_ADD ((chi_method_t)2)
#define CHI_METHOD_CHECKSUM ((chi_method_t)3)

/* ---------------------------------------------------------------- statuses */

#define CHI_OK 0
#define CHI_ERR_INVALID (-1)       /* bad argument, stale/unknown future      */
#define CHI_ERR_NOMEM (-2)         /* allocation failed                       */
#define CHI_ERR_TIMEOUT (-3)       /* wait timed out; the future stays valid  */
#define CHI_ERR_AGAIN (-4)         /* queue or slots full; try again          */
#define CHI_ERR_NOT_FOUND (-5)     /* unknown method or name                  */
#define CHI_ERR_NO_DEVICE (-6)     /* GPU route but no usable GPU             */
#define CHI_ERR_DISCONNECTED (-7)  /* server gone                             */
#define CHI_ERR_PROTOCOL (-8)      /* malformed message, version skew         */
#define CHI_ERR_TOO_LARGE (-9)     /* payload over the limit, or output buffer
                                      too small (see chi_wait)                */
#define CHI_ERR_CONFIG (-10)       /* bad configuration file or value         */
#define CHI_ERR_PERMISSION (-11)   /* not allowed                             */
#define CHI_ERR_SHUTDOWN (-12)     /* runtime is finalizing                   */
#define CHI_ERR_INTERNAL (-13)     /* a bug or broken invariant in chimaera   */
/* Handlers may return their own codes at or below this value; chi_wait passes
 * them through unchanged. */
#define CHI_ERR_USER_BASE (-1000)

/* Static English text for a status, never NULL ("unknown status" for values
 * chimaera does not define; "handler-defined error" for codes <= -1000).
 * Thread safety: safe from any thread. */
CHI_API const char *chi_status_string(chi_status_t status);

/* Detail of the calling thread's most recent failed chi_* call (for example
 * "config.yaml:3:5: unknown key 'wrokers'").  Empty string, never NULL, when
 * nothing failed yet.  The pointer stays valid until this thread's next chi_*
 * call.  Thread safety: thread-local. */
CHI_API const char *chi_last_error_message(void);

/* ----------------------------------------------------------- configuration */

typedef struct chi_runtime chi_runtime_t; /* opaque */

/* Options for chi_init.  Size-prefixed: always fill it with chi_config_init,
 * then change fields.  Fields are only appended in later versions. */
typedef struct chi_config {
  size_t struct_size;         /* set by chi_config_init                        */
  const char *config_path;    /* YAML file; NULL: $CHI_CONFIG, else defaults   */
  int32_t mode;               /* CHI_MODE_EMBEDDED (default) or CHI_MODE_CLIENT */
  const char *server_address; /* client mode: "shm://NAME", "ipc://PATH",
                                 "tcp://HOST:PORT"; NULL: from config/env    */
  int32_t num_workers;        /* CPU worker threads; 0: from config/default   */
  int32_t gpus;               /* -1: all visible GPUs (default), 0: none       */
  /* Any settings of the configuration file, as YAML text ("queue_depth:
   * 4096\nworker_stack_size: 64M\n"); nested keys may also be written
   * dotted ("gpu.lease_us: 0").  NULL or "": none.  Applied over the file
   * and the environment; the fields above win over the same keys here.
   * Errors name "chi_config_t.settings:LINE:COLUMN" (CHI_ERR_CONFIG).
   * Lets bindings reach every key without a field per key. */
  const char *settings;
} chi_config_t;

/* Fills *cfg with defaults and sets struct_size.  NULL is ignored.
 * Thread safety: safe from any thread. */
CHI_API void chi_config_init(chi_config_t *cfg);

/* Starts a runtime.
 *   cfg  [in]  options, or NULL for defaults; read only during the call.
 *   rt   [out] the new runtime; set to NULL on failure.
 * Settings are taken, lowest to highest priority, from built-in defaults, the
 * YAML file (cfg->config_path, else $CHI_CONFIG), CHI_* environment variables,
 * cfg->settings and the other non-default fields of *cfg.  Built-in methods are registered and the
 * worker threads started before it returns.
 * Returns CHI_OK, CHI_ERR_INVALID (NULL rt, bad struct_size or field),
 * CHI_ERR_CONFIG (file unreadable, unknown key, wrong type, out of range: the
 * message names file:line:column, or chi_config_t.settings:line:column), CHI_ERR_NOMEM, CHI_ERR_NO_DEVICE (cfg->gpus
 * > 0 but fewer GPUs usable), CHI_ERR_DISCONNECTED (client mode, no server),
 * CHI_ERR_INTERNAL.
 * Ownership: the caller owns *rt and releases it with chi_finalize.
 * Thread safety: safe; each call makes an independent runtime. */
CHI_API chi_status_t chi_init(const chi_config_t *cfg, chi_runtime_t **rt);

/* Stops a runtime: refuses new submissions (CHI_ERR_SHUTDOWN), runs every task
 * already queued to completion, stops GPU orchestrators, joins all threads and
 * frees everything, outstanding futures included.  NULL is a no-op (CHI_OK).
 * Thread safety: not concurrent with any other call on the same runtime, and
 * never from one of its handlers (CHI_ERR_INVALID). */
CHI_API chi_status_t chi_finalize(chi_runtime_t *rt);

/* ----------------------------------------------------------------- methods */

/* A task as its handler sees it.  input points to input_size bytes valid for
 * the duration of the call; the handler writes at most output_capacity bytes
 * to output and sets output_size. */
typedef struct chi_request {
  chi_method_t method;
  chi_route_t source; /* CHI_ROUTE_CPU for host callers, the GPU id for kernels */
  const void *input;
  size_t input_size;
  void *output;
  size_t output_capacity;
  size_t output_size; /* set by the handler (0 on entry) */
} chi_request_t;

/* A CPU handler.  Returns CHI_OK, or any negative status (its own codes <=
 * CHI_ERR_USER_BASE), which the waiter receives unchanged.  It may call
 * chi_submit and chi_wait on the same runtime (see docs/threading.md for the
 * rules that keep the pool from deadlocking). */
typedef chi_status_t (*chi_handler_t)(chi_request_t *req, void *user_data);

/* Registers a CPU handler under a unique name.
 *   name      [in]  1..127 bytes of printable ASCII, copied.
 *   fn        [in]  the handler; must not be NULL.
 *   user_data [in]  passed to every call of fn; not owned by the runtime.
 *   method    [out] the method id, fixed for the runtime's life (may be NULL).
 * A name that so far has only a GPU handler (a user orchestrator's method)
 * gains this CPU handler under the same id.  Ids are unique among the live
 * runtimes of a process (the built-ins' fixed ids aside), so an id used with
 * another runtime is refused there (CHI_ERR_NOT_FOUND from chi_submit).
 * Returns CHI_OK, CHI_ERR_INVALID (NULL or bad argument, name already has a
 * CPU handler), CHI_ERR_NOMEM (method table full: 4092 methods among the
 * live runtimes of the process), CHI_ERR_SHUTDOWN.
 * Thread safety: safe; tasks may already be running. */
CHI_API chi_status_t chi_register_handler(chi_runtime_t *rt, const char *name, chi_handler_t fn,
                                          void *user_data, chi_method_t *method);

/* Looks a method up by name (CPU and GPU methods alike).
 * Returns CHI_OK, CHI_ERR_INVALID (NULL argument), CHI_ERR_NOT_FOUND.
 * Thread safety: safe. */
CHI_API chi_status_t chi_method_lookup(chi_runtime_t *rt, const char *name, chi_method_t *method);

/* ------------------------------------------------------------------- tasks */

/* Submits a task.
 *   route      CHI_ROUTE_CPU / CHI_ROUTE_LOCAL (CPU workers, from host code),
 *              CHI_ROUTE_GPU_ANY or a GPU number >= 0.
 *   input      [in] input_size bytes, copied before the call returns (may be
 *              NULL when input_size is 0).
 *   future     [out] handle for chi_wait/chi_test/chi_release.
 * Returns CHI_OK, CHI_ERR_INVALID (NULL rt/future, NULL input with a size,
 * method 0, bad route, GPU number out of range), CHI_ERR_NOT_FOUND (a method
 * id never registered on this runtime, or one of another runtime: refused,
 * never run), CHI_ERR_TOO_LARGE (input_size over max_inline_payload),
 * CHI_ERR_AGAIN (every task slot in use, all queue_depth of them: at once in
 * the non-blocking submit mode or from a handler, else after
 * submit_timeout_ms), CHI_ERR_NOMEM (no memory for more task slots),
 * CHI_ERR_NO_DEVICE (GPU route, no usable GPU), CHI_ERR_SHUTDOWN.
 * A method registered but without a handler on the chosen executor is not an
 * error here: chi_wait returns CHI_ERR_NOT_FOUND.
 * Ownership: the future must be consumed by one chi_wait that returns a
 * result or by chi_release; otherwise its slot stays in use until
 * chi_finalize.  Thread safety: safe from any thread, handlers included. */
CHI_API chi_status_t chi_submit(chi_runtime_t *rt, chi_route_t route, chi_method_t method,
                                const void *input, size_t input_size, chi_future_t *future);

/* Waits for a task and takes its result.
 *   timeout_ns       < 0: wait forever; 0: poll once; > 0: at most that long.
 *   output           [out] buffer for the handler's output, or NULL to discard it.
 *   output_capacity  size of output in bytes.
 *   output_size      [out] bytes of output (or bytes needed), may be NULL.
 * Returns the handler's status (CHI_OK, any library status, or its own code <=
 * CHI_ERR_USER_BASE, unchanged) once the task ran; the future is then consumed.
 * Before that it returns, leaving the future valid:
 *   CHI_ERR_TIMEOUT    the task has not finished within timeout_ns;
 *   CHI_ERR_TOO_LARGE  output is non-NULL and output_capacity is smaller than
 *                      the result: *output_size says the size needed.
 * Returns CHI_ERR_INVALID for NULL rt, future 0, a future already consumed,
 * released, from another runtime or never issued.
 * Handlers should not return CHI_ERR_TIMEOUT or CHI_ERR_TOO_LARGE themselves:
 * such a result consumes the future like any handler status, and the caller
 * can only tell it from the two cases above with chi_test (CHI_ERR_INVALID
 * once consumed).
 * Thread safety: safe; one future is consumed by exactly one caller, other
 * callers of the same future then get CHI_ERR_INVALID. */
CHI_API chi_status_t chi_wait(chi_runtime_t *rt, chi_future_t future, int64_t timeout_ns,
                              void *output, size_t output_capacity, size_t *output_size);

/* Reports without blocking whether a task has finished (*done = 1) or not (0).
 * The future stays valid either way.
 * Returns CHI_OK or CHI_ERR_INVALID (NULL argument, stale/unknown future).
 * Thread safety: safe. */
CHI_API chi_status_t chi_test(chi_runtime_t *rt, chi_future_t future, int *done);

/* Drops interest in a task: it still runs, its result is discarded and its
 * slot recycled.  The future is consumed.
 * Returns CHI_OK or CHI_ERR_INVALID (NULL rt, stale/unknown future).
 * Thread safety: safe. */
CHI_API chi_status_t chi_release(chi_runtime_t *rt, chi_future_t future);

/* --------------------------------------------------------------- batches */

/* The most tasks (futures) one chi_submit_batch (chi_wait_batch) call takes. */
#define CHI_BATCH_MAX 1048576

/* One task of a batch (chi_submit_batch): the arguments chi_submit takes. */
typedef struct chi_task_desc {
  chi_method_t method;
  const void *input; /* input_size bytes, copied; may be NULL when input_size is 0 */
  size_t input_size;
} chi_task_desc_t;

/* Submits n tasks on one route, in order, as n calls of chi_submit would.
 *   route      as chi_submit.
 *   tasks      [in] n task descriptions; may be NULL when n is 0.
 *   n          0..CHI_BATCH_MAX.
 *   futures    [out] n futures: futures[i] is task i's; may be NULL when n is 0.
 *   submitted  [out] the number of tasks queued (may be NULL).
 * Stops at the first task that cannot be queued and returns its status:
 * tasks [0, *submitted) are queued and their futures valid (each consumed as
 * chi_submit's), futures[*submitted .. n-1] are set to 0 and those tasks
 * never run.  The message (chi_last_error_message) names the task's index.
 * On CHI_ROUTE_CPU / CHI_ROUTE_LOCAL from host code of an embedded runtime
 * the tasks take their slots and join the run queues in groups, with one
 * wake-up decision per group; other routes and client runtimes submit them
 * one at a time inside the library (the same results, without the saving).
 * Returns CHI_OK (all n queued; also for n == 0), CHI_ERR_INVALID (NULL rt,
 * NULL tasks or futures with n > 0, n over CHI_BATCH_MAX: nothing queued;
 * or a task with method 0 or NULL input with a size), and for a task every
 * other status of chi_submit (CHI_ERR_NOT_FOUND, CHI_ERR_TOO_LARGE,
 * CHI_ERR_AGAIN, CHI_ERR_NOMEM, CHI_ERR_NO_DEVICE, CHI_ERR_SHUTDOWN, ...).
 * In the non-blocking submit mode (or from a handler) a batch larger than the
 * free slots gives CHI_ERR_AGAIN with *submitted < n; in the blocking mode
 * the tasks already queued run while the call waits for more slots.
 * Ownership: as chi_submit, for each of the *submitted futures.
 * Thread safety: safe from any thread, handlers included. */
CHI_API chi_status_t chi_submit_batch(chi_runtime_t *rt, chi_route_t route,
                                      const chi_task_desc_t *tasks, size_t n,
                                      chi_future_t *futures, size_t *submitted);

/* Where one future's result goes (chi_wait_batch). */
typedef struct chi_task_result {
  void *output;           /* [in] buffer for the output, or NULL to discard it */
  size_t output_capacity; /* [in] size of output in bytes                     */
  size_t output_size;     /* [out] bytes of output (or bytes needed)           */
  chi_status_t status;    /* [out] the task's status, as chi_wait returns it   */
} chi_task_result_t;

/* Waits for n tasks, in order, and takes their results.
 *   futures    [in] n futures (from chi_submit or chi_submit_batch, of any
 *              route); may be NULL when n is 0.
 *   n          0..CHI_BATCH_MAX.
 *   timeout_ns bounds the whole call: < 0 forever; 0 poll each future once;
 *              > 0 at most that long in all.
 *   results    [in/out] n results: results[i] gives future i's buffer and
 *              receives its status and output size.
 *   done       [out] futures whose result was taken (may be NULL).
 * Takes the results in order.  A task's own status (CHI_OK, a library status
 * or a handler's code, as chi_wait would return it) goes to results[i].status
 * and consumes futures[i]; the call goes on with the next.  It stops at the
 * first future that gives no result and returns why, with *done its index:
 *   CHI_ERR_TIMEOUT    the task did not finish in time;
 *   CHI_ERR_TOO_LARGE  results[*done].output is non-NULL and too small:
 *                      results[*done].output_size says the size needed;
 *   CHI_ERR_DISCONNECTED  client runtime, the server is gone;
 *   CHI_ERR_INVALID    futures[*done] is 0, stale (consumed or released),
 *                      of another runtime or never issued.
 * results[*done].status then holds that status too.  futures[*done] and every
 * later future are left as they were (still valid unless stale), and the
 * later results untouched; futures [0, *done) are consumed.
 * Returns CHI_OK when all n results were taken (whatever their statuses; also
 * for n == 0), the stop status above, or CHI_ERR_INVALID with nothing taken
 * for NULL rt, NULL futures or results with n > 0, n over CHI_BATCH_MAX.
 * Embedded CPU futures are taken with one slot hand-back per group of
 * results; other futures one at a time inside the library.
 * Thread safety: safe; one future is consumed by exactly one caller (as
 * chi_wait), so a future waited on by another thread meanwhile may stop the
 * batch with CHI_ERR_INVALID. */
CHI_API chi_status_t chi_wait_batch(chi_runtime_t *rt, const chi_future_t *futures, size_t n,
                                    int64_t timeout_ns, chi_task_result_t *results,
                                    size_t *done);

/* ------------------------------------------------------------------ modules */

/* Loads a shared object and calls its exported
 *   chi_status_t chimaera_module_init(chi_runtime_t *rt, uint32_t chi_version);
 * which registers its handlers.  The object stays loaded until chi_finalize.
 * While it loads and its init runs, the GPU orchestrators that run are paused
 * (a module's device code cannot load beside a running persistent kernel):
 * GPU tasks submitted meanwhile wait in their queues and run after.
 * Returns CHI_OK, CHI_ERR_INVALID (NULL argument), CHI_ERR_NOT_FOUND (cannot
 * open, or no chimaera_module_init), CHI_ERR_INTERNAL (an orchestrator could
 * not be paused or resumed), or the status the init function returned.
 * Thread safety: safe. */
CHI_API chi_status_t chi_load_module(chi_runtime_t *rt, const char *path);

/* Signature of the function a module exports (not part of the library). */
typedef chi_status_t (*chi_module_init_t)(chi_runtime_t *rt, uint32_t chi_version);

/* ---------------------------------------------------------------- memory */

/* A reference to registered memory, carried inside a task's input. */
typedef struct chi_mem_ref {
  uint64_t region; /* from chi_register_gpu_mem */
  uint64_t offset; /* bytes from the region's start */
  uint64_t length; /* bytes */
} chi_mem_ref_t;

/* Registers memory that tasks may reference by (region, offset, length).
 *   gpu         a GPU number >= 0 (device_ptr is that GPU's device memory), or
 *               CHI_ROUTE_CPU (host memory, works without a GPU).
 *   device_ptr  [in] start of the memory; owned by the caller, who keeps it
 *               alive until chi_unregister_mem.
 *   region      [out] the region id (never 0).
 * In a client process with gpu >= 0: memory from cudaMalloc on the client's
 * CUDA device `gpu`; the server maps it (CUDA IPC) and registers the region
 * in its own table, so the server's CPU and GPU handlers resolve references
 * to it (chi_mem_resolve in the client refuses them); it is unregistered by
 * chi_unregister_mem or when the client's session ends (docs/server.md,
 * "Client device memory").
 * Returns CHI_OK, CHI_ERR_INVALID (NULL pointer, size 0, pointer not on that
 * GPU), CHI_ERR_NO_DEVICE (GPU number with no usable GPU), CHI_ERR_NOMEM
 * (region table full); in a client also CHI_ERR_DISCONNECTED and the
 * server's refusals (with its message).  Thread safety: safe. */
CHI_API chi_status_t chi_register_gpu_mem(chi_runtime_t *rt, int32_t gpu, void *device_ptr,
                                          size_t size, uint64_t *region);

/* Forgets a region; later references to it are rejected.
 * Returns CHI_OK or CHI_ERR_INVALID (unknown region).  Thread safety: safe. */
CHI_API chi_status_t chi_unregister_mem(chi_runtime_t *rt, uint64_t region);

/* Resolves a reference for a CPU handler: *ptr = region start + offset, after
 * checking that [offset, offset + length) lies inside the region; *gpu (may be
 * NULL) says where the memory lives (GPU number, or CHI_ROUTE_CPU).
 * Returns CHI_OK, CHI_ERR_INVALID (NULL argument, unknown region, range
 * outside the region).  Thread safety: safe. */
CHI_API chi_status_t chi_mem_resolve(chi_runtime_t *rt, const chi_mem_ref_t *ref, void **ptr,
                                     int32_t *gpu);

/* -------------------------------------------------------------- statistics */

/* Counters of one route (see chi_stats).  The counts are exact.  Latencies
 * run from submission to the end of the handler, from a log-linear histogram
 * (each figure is the upper edge of its bucket: at most ~19% above the true
 * value); 0 when no task of the route was timed.  On CHI_STATS_CPU and
 * CHI_STATS_CLIENT they are sampled: each submitting thread (for client
 * tasks, each server thread that takes them) times its first task and then
 * one in 64 (two clock reads per timed task), so latency_max_ns is the
 * largest of the sampled tasks.  On CHI_STATS_CLIENT they run from when the
 * server took the task to when its result was published. */
typedef struct chi_route_stats {
  uint64_t submitted;      /* tasks accepted                               */
  uint64_t completed;      /* tasks finished with CHI_OK                   */
  uint64_t failed;         /* tasks finished with another status           */
  uint64_t in_flight;      /* accepted and not yet finished                */
  uint64_t latency_p50_ns;
  uint64_t latency_p99_ns;
  uint64_t latency_max_ns;
} chi_route_stats_t;

/* Indices of chi_stats_t.routes. */
#define CHI_STATS_CPU 0    /* host code -> CPU workers (timed)                    */
#define CHI_STATS_GPU 1    /* host code -> GPU orchestrators (counted at submit and
                              when the future is consumed; not timed)             */
#define CHI_STATS_CLIENT 2 /* client processes -> this server, every route (timed) */
#define CHI_STATS_ROUTES 4 /* entries in routes[] (the last is reserved)          */

typedef struct chi_stats {
  size_t struct_size;                          /* set by the caller: sizeof(chi_stats_t) */
  chi_route_stats_t routes[CHI_STATS_ROUTES];
  uint32_t workers;        /* CPU worker threads                               */
  uint32_t clients;        /* client sessions connected (a serving runtime)    */
  int32_t gpus;            /* GPUs driven                                      */
  uint32_t reserved;
  uint64_t slots_in_use;   /* CPU task slots held (queued, running or unclaimed) */
  uint64_t slots_total;
  uint64_t device_slots_in_use; /* GPU->GPU and GPU->CPU slots held by device futures, every GPU
                                   (a released future's until its task ended and it was freed) */
  uint64_t device_slots_total;  /* 2 x gpu.device_slots x GPUs */
  uint64_t tasks_cancelled;     /* client tasks dropped unstarted because their client
                                   disconnected (also counted failed in routes[CHI_STATS_CLIENT]) */
  uint64_t gpus_parked;   /* bit g set: GPU g (< 64) is parked: idle, no chimaera kernel
                             resident until its next CPU->GPU task (gpu.keep_alive_us) */
  uint64_t gpu_launches;  /* orchestrator kernel launches so far, every GPU */
  uint64_t gpu_parks;     /* times a GPU parked, every GPU */
} chi_stats_t;

/* Reads the runtime's counters.  In client mode they are the server's (one
 * round trip over the session socket).
 *   stats  [in/out] struct_size must be set; the library fills at most that
 *          many bytes.
 * Returns CHI_OK, CHI_ERR_INVALID (NULL, struct_size too small),
 * CHI_ERR_DISCONNECTED (client mode, server gone).  Thread safety: safe. */
CHI_API chi_status_t chi_stats(chi_runtime_t *rt, chi_stats_t *stats);

/* ------------------------------------------------------------------ server */

typedef struct chi_server chi_server_t; /* opaque */

/* Serves this (embedded) runtime to client processes (what chimaera-server
 * does; see docs/server.md).
 *   address  "shm://NAME" (shared memory, same user), "ipc://PATH" or
 *            "tcp://HOST:PORT" (ZeroMQ; tcp on a non-loopback host only
 *            with CURVE keys); "" for this user's default server (what a
 *            client with no address connects to); NULL: every address of
 *            the config key server.listen (one server: its status lists
 *            them all), else the default server.
 *   srv      [out] the server; stopped by chi_server_stop or chi_finalize.
 * A shm:// endpoint is a Unix socket in a per-user directory (mode 0700):
 * $CHI_RUNTIME_DIR, else $XDG_RUNTIME_DIR/chimaera, else /tmp/chimaera-UID.
 * Returns CHI_OK, CHI_ERR_INVALID (bad address, NULL argument, a client
 * runtime), CHI_ERR_PERMISSION (runtime directory not private),
 * CHI_ERR_AGAIN (another live server holds the address: the message names
 * its pid), CHI_ERR_INTERNAL (socket calls failed).  A stale endpoint left
 * by a dead server is taken over.  Thread safety: safe. */
CHI_API chi_status_t chi_server_start(chi_runtime_t *rt, const char *address, chi_server_t **srv);

/* Stops serving: accepts no more clients, answers tasks still queued in
 * client rings CHI_ERR_SHUTDOWN, waits up to drain_timeout_ms for tasks that
 * already run, tells every client the server is gone (their calls return
 * CHI_ERR_DISCONNECTED) and removes the endpoint files.  NULL is a no-op.
 * drain_timeout_ms UINT32_MAX means the config's server.shutdown_timeout_ms.
 * Returns CHI_OK, or CHI_ERR_TIMEOUT when tasks still ran at the bound (the
 * runtime then still owns them; chi_finalize waits for them).
 * Thread safety: not concurrent with other calls on the same server. */
CHI_API chi_status_t chi_server_stop(chi_server_t *srv, uint32_t drain_timeout_ms);

/* Blocks until a client asked the server to stop (chimaera-ctl stop) or
 * timeout_ms passed (< 0: no bound).  Returns CHI_OK (stop asked),
 * CHI_ERR_TIMEOUT, CHI_ERR_INVALID (NULL).  Thread safety: safe. */
CHI_API chi_status_t chi_server_wait_stop_request(chi_server_t *srv, int64_t timeout_ms);

/* Sends one administrative request to a running server, without becoming
 * a client (what chimaera-ctl does).
 *   address   "shm://NAME", "ipc://PATH", "tcp://HOST:PORT", or NULL / ""
 *             for this user's default server.
 *   request   "ping", "status" (a text report), "status-json" or "stop"
 *             (the server then stops as on SIGTERM).
 *   reply     [out] the server's answer, NUL-terminated (may be NULL).
 *   reply_size [out] bytes of the full answer without the NUL (may be NULL).
 * Returns CHI_OK, CHI_ERR_INVALID (bad address or request),
 * CHI_ERR_DISCONNECTED (no server there, or it stopped answering),
 * CHI_ERR_PERMISSION, CHI_ERR_PROTOCOL (version skew: the message names both
 * versions), CHI_ERR_TOO_LARGE (reply truncated to capacity - 1 bytes).
 * Thread safety: safe. */
CHI_API chi_status_t chi_server_query(const char *address, const char *request, char *reply,
                                      size_t capacity, size_t *reply_size);

/* -------------------------------------------------------------------- GPU */

/* A fixed-size POD that kernels receive by value (chimaera_device.h). */
typedef struct chi_dev_context {
  uint64_t opaque[32];
} chi_dev_context_t;

/* Number of GPUs this runtime drives (0 without CUDA/HIP or without a GPU).
 * Returns CHI_OK or CHI_ERR_INVALID.  Thread safety: safe. */
CHI_API chi_status_t chi_gpu_count(chi_runtime_t *rt, int32_t *count);

/* Fills *ctx with the device context of GPU `gpu`, to pass by value to
 * kernels that call chi_dev_submit and friends.  Valid until chi_finalize.
 * In a client process (CHI_MODE_CLIENT): a context for the process's own
 * kernels on the server's GPU `gpu` (the client's CUDA device of the same
 * number); every route of those kernels goes through a relay in the client
 * to the server (docs/server.md, "Client kernels").  The first call for a
 * GPU allocates the relay's memory and starts its threads: make it before
 * launching the kernels; finish them before chi_finalize.
 * Returns CHI_OK, CHI_ERR_INVALID (NULL argument, gpu out of range),
 * CHI_ERR_NO_DEVICE (no such GPU; in a client: the server drives none, or
 * the client sees no CUDA device `gpu`), CHI_ERR_NOMEM.  Thread safety: safe. */
CHI_API chi_status_t chi_gpu_context(chi_runtime_t *rt, int32_t gpu, chi_dev_context_t *ctx);

/* Stops GPU `gpu`'s orchestrator kernel (-1: every GPU) and waits until it
 * has exited, so that device-wide synchronization (cudaDeviceSynchronize,
 * cudaFree) can run.  Tasks submitted while paused stay queued and run after
 * chi_gpu_resume.  Pausing a paused GPU is a no-op.
 * Returns CHI_OK, CHI_ERR_INVALID (gpu out of range), CHI_ERR_NO_DEVICE,
 * CHI_ERR_INTERNAL (kernel fault; message from the CUDA/HIP runtime).
 * Thread safety: safe; concurrent pause/resume calls are serialized. */
CHI_API chi_status_t chi_gpu_pause(chi_runtime_t *rt, int32_t gpu);

/* Relaunches the orchestrator(s) stopped by chi_gpu_pause.  Returns as
 * chi_gpu_pause.  Thread safety: as chi_gpu_pause. */
CHI_API chi_status_t chi_gpu_resume(chi_runtime_t *rt, int32_t gpu);

/* Launch parameters the runtime hands a user orchestrator's launcher. */
typedef struct chi_gpu_launch {
  size_t struct_size;
  int32_t gpu;                /* device ordinal to launch on (already current) */
  void *stream;               /* cudaStream_t / hipStream_t, non-blocking      */
  uint32_t blocks;            /* grid size                                     */
  uint32_t threads_per_block; /* block size (a multiple of the warp size)      */
  const void *state;          /* device pointer: the orchestrator's state      */
} chi_gpu_launch_t;

/* A launcher made by CHI_DEFINE_ORCHESTRATOR (chimaera_device.h) in the user's
 * own .cu file.  Returns CHI_OK or CHI_ERR_INTERNAL (launch failed). */
typedef chi_status_t (*chi_gpu_launch_fn)(const chi_gpu_launch_t *launch);

/* A user orchestrator: the launcher and the names of the GPU methods its
 * dispatch serves, in the order of its dispatch indices. */
typedef struct chi_gpu_orchestrator {
  size_t struct_size;
  chi_gpu_launch_fn launch;
  const char *const *method_names;
  uint32_t method_count;
} chi_gpu_orchestrator_t;

/* Replaces the built-in orchestrator of GPU `gpu` (-1: every GPU) by a user
 * orchestrator, registering each of its method names as a GPU method (a name
 * that already has a CPU handler gains a GPU handler; the same id serves
 * both).  Built-in methods keep working.  Tasks queued meanwhile are kept.
 * Returns CHI_OK, CHI_ERR_INVALID (NULL or bad field, name already a GPU
 * method), CHI_ERR_NO_DEVICE, CHI_ERR_INTERNAL (launch failed).
 * Thread safety: safe; serialized with pause/resume. */
CHI_API chi_status_t chi_gpu_set_orchestrator(chi_runtime_t *rt, int32_t gpu,
                                              const chi_gpu_orchestrator_t *orch);

#ifdef __cplusplus
}
#endif

#endif /* CHIMAERA_H */
