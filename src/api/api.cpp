// The C boundary: every exported function checks its arguments, catches every
// exception, and answers with a status (detail in chi_last_error_message).
#include <dlfcn.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <exception>
#include <new>

#include "api/handle.h"
#include "base/error.h"
#include "base/futex.h"
#include "base/log.h"
#include "chimaera.h"
#include "client/client.h"
#include "core/runtime.h"
#include "ipc/frame.h"
#include "server/server.h"

using chi::set_error;

namespace {

constexpr uint64_t kRuntimeMagic = 0x6368696d61657261ull;  // "chimaera"

template <class F>
chi_status_t guarded(F &&f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc &) {
    return set_error(CHI_ERR_NOMEM, "out of memory");
  } catch (const std::exception &e) {
    return set_error(CHI_ERR_INTERNAL, "internal error: %s", e.what());
  } catch (...) {
    return set_error(CHI_ERR_INTERNAL, "internal error: unknown exception");
  }
}

bool valid_handle(chi_runtime_t *rt) {
  return rt && rt->magic == kRuntimeMagic && (rt->engine || rt->client);
}

chi::Runtime *engine_of(chi_runtime_t *rt) {
  return valid_handle(rt) ? rt->engine : nullptr;
}

#define CHI_HANDLE(rt)    \
  if (!valid_handle(rt)) \
  return set_error(CHI_ERR_INVALID, "runtime is NULL or not a chimaera runtime")

// The engine of an embedded runtime; calls that need one say so for clients.
#define CHI_ENGINE(rt, var)                                                                   \
  CHI_HANDLE(rt);                                                                             \
  chi::Runtime *var = engine_of(rt);                                                          \
  if (!var)                                                                                   \
    return set_error(CHI_ERR_INVALID, "%s: not available on a client runtime (see docs/server.md)", \
                     __func__)

// The in-process engine behind calls about handlers, modules and memory: the
// runtime itself, or a client's local pool (made on first use when create).
chi_status_t local_engine(chi_runtime_t *rt, bool create, chi::Runtime **e) {
  if (rt->engine) {
    *e = rt->engine;
    return CHI_OK;
  }
  return rt->client->local(create, e);
}

// The orchestrators are the server's: a client does not pause or replace them.
chi_status_t client_gpu_refusal(const char *what) {
  return set_error(CHI_ERR_NO_DEVICE,
                   "%s: the server's orchestrators are not a client's to control (client kernels use "
                   "chi_gpu_context, host code chi_submit)",
                   what);
}

#define CHI_NONNULL(p) \
  if (!(p)) return set_error(CHI_ERR_INVALID, "argument '%s' is NULL", #p)

chi_status_t resolve_engine_future(chi::Runtime *e, chi_future_t f, chi::Executor **exec,
                                   chi::FutureParts *parts) {
  if (!chi::decode_future(f, parts)) return set_error(CHI_ERR_INVALID, "future 0 is never valid");
  if (parts->tag != e->tag())
    return set_error(CHI_ERR_INVALID, "future %#llx does not belong to this runtime",
                     (unsigned long long)f);
  *exec = e->pool(parts->pool);
  if (!*exec)
    return set_error(CHI_ERR_INVALID, "future %#llx names no executor of this runtime",
                     (unsigned long long)f);
  return CHI_OK;
}

// Where a future goes: *client set for a client's server task, else *exec.
chi_status_t resolve_future(chi_runtime_t *rt, chi_future_t f, chi::Executor **exec,
                            chi::FutureParts *parts, chi::Client **client,
                            chi::Runtime **engine) {
  *client = nullptr;
  if (rt->engine) {
    *engine = rt->engine;
    return resolve_engine_future(rt->engine, f, exec, parts);
  }
  if (!chi::decode_future(f, parts)) return set_error(CHI_ERR_INVALID, "future 0 is never valid");
  if (parts->tag == rt->client->tag() && parts->pool == chi::kClientPool) {
    *client = rt->client;
    return CHI_OK;
  }
  chi::Runtime *l = rt->client->local_if_any();
  if (!l || parts->tag != l->tag())
    return set_error(CHI_ERR_INVALID, "future %#llx does not belong to this runtime",
                     (unsigned long long)f);
  *engine = l;
  return resolve_engine_future(l, f, exec, parts);
}

void count_gpu_result(chi::Runtime *e, const chi::FutureParts &p, chi_status_t s) {
  if (p.pool != chi::kCpuPool && s != CHI_ERR_TIMEOUT && s != CHI_ERR_TOO_LARGE && s != CHI_ERR_INVALID)
    e->stats(CHI_STATS_GPU).finished(s, -1);
}

}  // namespace

extern "C" {

CHI_API uint32_t chi_version(void) { return CHI_VERSION_NUMBER; }

CHI_API const char *chi_version_string(void) {
#define CHI_STR2(x) #x
#define CHI_STR(x) CHI_STR2(x)
  return CHI_STR(CHI_VERSION_MAJOR) "." CHI_STR(CHI_VERSION_MINOR) "." CHI_STR(CHI_VERSION_PATCH);
}

CHI_API const char *chi_status_string(chi_status_t status) {
  switch (status) {
    case CHI_OK: return "success";
    case CHI_ERR_INVALID: return "invalid argument or stale future";
    case CHI_ERR_NOMEM: return "out of memory";
    case CHI_ERR_TIMEOUT: return "timed out";
    case CHI_ERR_AGAIN: return "resource temporarily unavailable (queue full)";
    case CHI_ERR_NOT_FOUND: return "not found";
    case CHI_ERR_NO_DEVICE: return "no usable GPU";
    case CHI_ERR_DISCONNECTED: return "disconnected from server";
    case CHI_ERR_PROTOCOL: return "protocol error";
    case CHI_ERR_TOO_LARGE: return "too large";
    case CHI_ERR_CONFIG: return "configuration error";
    case CHI_ERR_PERMISSION: return "permission denied";
    case CHI_ERR_SHUTDOWN: return "runtime is shutting down";
    case CHI_ERR_INTERNAL: return "internal error";
    default: return status <= CHI_ERR_USER_BASE ? "handler-defined error" : "unknown status";
  }
}

CHI_API const char *chi_last_error_message(void) { return chi::last_error(); }

CHI_API void chi_config_init(chi_config_t *cfg) {
  if (!cfg) return;
  std::memset(cfg, 0, sizeof *cfg);
  cfg->struct_size = sizeof *cfg;
  cfg->config_path = nullptr;
  cfg->mode = CHI_MODE_EMBEDDED;
  cfg->server_address = nullptr;
  cfg->num_workers = 0;
  cfg->gpus = -1;
}

CHI_API chi_status_t chi_init(const chi_config_t *cfg, chi_runtime_t **rt) {
  return guarded([&]() -> chi_status_t {
    CHI_NONNULL(rt);
    *rt = nullptr;
    chi::Config config;
    std::string err;
    if (chi_status_t s = chi::load_config(cfg, &config, &err); s != CHI_OK)
      return set_error(s, "%s", err.c_str());
    auto handle = std::make_unique<chi_runtime>();
    handle->magic = kRuntimeMagic;
    handle->engine = nullptr;
    handle->client = nullptr;
    if (config.mode == CHI_MODE_CLIENT) {
      chi::set_log_level(config.log_level);
      std::unique_ptr<chi::Client> client;
      if (chi_status_t s = chi::connect_client(config, &client); s != CHI_OK) return s;
      handle->client = client.release();
      *rt = handle.release();
      return CHI_OK;
    }
    auto engine = std::make_unique<chi::Runtime>(std::move(config));
    if (chi_status_t s = engine->start(); s != CHI_OK) return s;
    handle->engine = engine.get();
    for (const std::string &path : engine->config().modules) {
      if (chi_status_t s = chi_load_module(handle.get(), path.c_str()); s != CHI_OK) {
        std::string msg = chi::last_error();
        engine->shutdown();
        return set_error(s, "config key 'modules': %s", msg.c_str());
      }
    }
    engine.release();
    *rt = handle.release();
    return CHI_OK;
  });
}

CHI_API chi_status_t chi_finalize(chi_runtime_t *rt) {
  if (!rt) return CHI_OK;
  return guarded([&]() -> chi_status_t {
    CHI_HANDLE(rt);
    chi::Runtime *e = rt->engine ? rt->engine : rt->client->local_if_any();
    if (e && e->cpu().in_handler())
      return set_error(CHI_ERR_INVALID, "chi_finalize called from one of the runtime's handlers");
    chi_status_t s = CHI_OK;
    std::string msg;
    if (rt->engine) {
      // Servers first: they refuse new client tasks and let running ones end.
      std::vector<chi::Server *> servers;
      {
        std::lock_guard<std::mutex> lock(rt->servers_mu);
        servers.swap(rt->servers);
      }
      for (chi::Server *srv : servers) srv->stop(UINT32_MAX);
      s = e->shutdown();
      msg = s != CHI_OK ? chi::last_error() : "";
      // After the workers stopped: no task can still complete into a session.
      for (chi::Server *srv : servers) delete srv;
      delete e;
    } else {
      delete rt->client;
    }
    rt->magic = 0;
    rt->engine = nullptr;
    rt->client = nullptr;
    delete rt;
    if (s != CHI_OK) set_error(s, "%s", msg.c_str());
    return s;
  });
}

CHI_API chi_status_t chi_register_handler(chi_runtime_t *rt, const char *name, chi_handler_t fn,
                                          void *user_data, chi_method_t *method) {
  return guarded([&]() -> chi_status_t {
    CHI_HANDLE(rt);
    if (rt->client) return rt->client->register_handler(name, fn, user_data, method);
    chi::Runtime *e = rt->engine;
    if (e->stopping()) return set_error(CHI_ERR_SHUTDOWN, "runtime is shutting down");
    return e->registry().add_cpu(name, fn, user_data, method);
  });
}

CHI_API chi_status_t chi_method_lookup(chi_runtime_t *rt, const char *name, chi_method_t *method) {
  return guarded([&]() -> chi_status_t {
    CHI_HANDLE(rt);
    CHI_NONNULL(name);
    CHI_NONNULL(method);
    if (rt->client) return rt->client->lookup(name, method);
    return rt->engine->registry().lookup(name, method);
  });
}

namespace {

// The checks of one task that do not depend on the route.
chi_status_t check_task(chi::Runtime *e, chi_method_t method, const void *input, size_t input_size) {
  if (!input && input_size)
    return set_error(CHI_ERR_INVALID, "input is NULL but input_size is %zu", input_size);
  if (method == 0) return set_error(CHI_ERR_INVALID, "method 0 is never a valid method id");
  if (!e->registry().get(method)) {
    // Ids are unique among live runtimes: another runtime's id is refused
    // here, never run as whatever this runtime registered under that number.
    if (chi::method_id_in_use(method))
      return set_error(CHI_ERR_NOT_FOUND, "method %u is a method of another runtime", method);
    return set_error(CHI_ERR_NOT_FOUND, "method %u was never registered on this runtime", method);
  }
  if (input_size > e->config().max_inline_payload)
    return set_error(CHI_ERR_TOO_LARGE, "input of %zu bytes over max_inline_payload %u", input_size,
                     e->config().max_inline_payload);
  return CHI_OK;
}

// Handlers still drain during chi_finalize and may submit follow-up work.
chi_status_t check_not_stopping(chi::Runtime *e) {
  if (e->stopping() && !e->cpu().on_worker_thread())
    return set_error(CHI_ERR_SHUTDOWN, "runtime is shutting down");
  return CHI_OK;
}

chi_status_t engine_submit(chi::Runtime *e, chi_route_t route, chi_method_t method,
                           const void *input, size_t input_size, chi_future_t *future) {
  if (chi_status_t s = check_task(e, method, input, input_size); s != CHI_OK) return s;
  if (chi_status_t s = check_not_stopping(e); s != CHI_OK) return s;
  chi::Executor *exec;
  uint32_t pool;
  if (chi_status_t s = e->route_executor(route, &exec, &pool); s != CHI_OK) return s;
  uint32_t slot, gen;
  if (chi_status_t s = exec->submit(method, input, input_size, &slot, &gen); s != CHI_OK) return s;
  if (pool != chi::kCpuPool) e->stats(CHI_STATS_GPU).submitted();
  *future = chi::encode_future(e->tag(), pool, gen, slot);
  return CHI_OK;
}

// chi_submit past the checks of its handle and future.
chi_status_t submit_one(chi_runtime_t *rt, chi_route_t route, chi_method_t method, const void *input,
                        size_t input_size, chi_future_t *future) {
  // The engine paths check the task in engine_submit (check_task).
  if (rt->engine) return engine_submit(rt->engine, route, method, input, input_size, future);
  if (!input && input_size)
    return set_error(CHI_ERR_INVALID, "input is NULL but input_size is %zu", input_size);
  if (!(method & chi::kLocalMethodBit)) return rt->client->submit(route, method, input, input_size, future);
  // One of this client's own handlers: it runs here, on the local pool.
  chi::Runtime *l = rt->client->local_if_any();
  if (!l) return set_error(CHI_ERR_NOT_FOUND, "method %#x was never registered", method);
  if (route != CHI_ROUTE_CPU && route != CHI_ROUTE_LOCAL)
    return set_error(CHI_ERR_NOT_FOUND,
                     "method %#x is a handler of this client process: only CHI_ROUTE_CPU runs it",
                     method);
  return engine_submit(l, route, method & ~chi::kLocalMethodBit, input, input_size, future);
}

// chi_submit_batch on an embedded runtime's CPU pool: every task is checked
// first, then the good prefix is queued in chunks; the first bad task's
// status comes after them, as a loop of chi_submit would return it.
chi_status_t engine_submit_batch(chi::Runtime *e, const chi_task_desc_t *tasks, size_t n,
                                 chi_future_t *futures, size_t *sent) {
  *sent = 0;
  if (chi_status_t s = check_not_stopping(e); s != CHI_OK) return s;
  size_t good = 0;
  chi_status_t bad = CHI_OK;
  for (; good < n; ++good)
    if ((bad = check_task(e, tasks[good].method, tasks[good].input, tasks[good].input_size)) != CHI_OK) break;
  if (chi_status_t s = e->cpu().submit_batch(tasks, good, e->tag(), futures, sent); s != CHI_OK) return s;
  // Queueing may have left a message of its own: say again why task `good` failed.
  if (bad != CHI_OK) return check_task(e, tasks[good].method, tasks[good].input, tasks[good].input_size);
  return CHI_OK;
}

// The status s, its message prefixed with the array element it is about.
chi_status_t at_index(chi_status_t s, const char *array, size_t i) {
  const std::string why = chi::last_error();
  return set_error(s, "%s[%zu]: %s", array, i, why.c_str());
}

chi_status_t check_batch(size_t n, const void *in, const char *in_name, const void *out,
                         const char *out_name) {
  if (n > CHI_BATCH_MAX)
    return set_error(CHI_ERR_INVALID, "batch of %zu over CHI_BATCH_MAX (%d)", n, CHI_BATCH_MAX);
  if (n && !in) return set_error(CHI_ERR_INVALID, "argument '%s' is NULL with n = %zu", in_name, n);
  if (n && !out) return set_error(CHI_ERR_INVALID, "argument '%s' is NULL with n = %zu", out_name, n);
  return CHI_OK;
}

}  // namespace

CHI_API chi_status_t chi_submit(chi_runtime_t *rt, chi_route_t route, chi_method_t method,
                                const void *input, size_t input_size, chi_future_t *future) {
  return guarded([&]() -> chi_status_t {
    CHI_HANDLE(rt);
    CHI_NONNULL(future);
    *future = 0;
    return submit_one(rt, route, method, input, input_size, future);
  });
}

CHI_API chi_status_t chi_submit_batch(chi_runtime_t *rt, chi_route_t route,
                                      const chi_task_desc_t *tasks, size_t n,
                                      chi_future_t *futures, size_t *submitted) {
  if (submitted) *submitted = 0;
  return guarded([&]() -> chi_status_t {
    CHI_HANDLE(rt);
    if (chi_status_t s = check_batch(n, tasks, "tasks", futures, "futures"); s != CHI_OK) return s;
    size_t sent = 0;
    chi_status_t s = CHI_OK;
    if (rt->engine && (route == CHI_ROUTE_CPU || route == CHI_ROUTE_LOCAL)) {
      s = engine_submit_batch(rt->engine, tasks, n, futures, &sent);
    } else {
      // GPU routes and client runtimes: one task at a time.
      for (; sent < n; ++sent) {
        futures[sent] = 0;
        s = submit_one(rt, route, tasks[sent].method, tasks[sent].input, tasks[sent].input_size,
                       &futures[sent]);
        if (s != CHI_OK) break;
      }
    }
    for (size_t i = sent; i < n; ++i) futures[i] = 0;
    if (submitted) *submitted = sent;
    return s == CHI_OK ? s : at_index(s, "tasks", sent);
  });
}

CHI_API chi_status_t chi_wait(chi_runtime_t *rt, chi_future_t future, int64_t timeout_ns,
                              void *output, size_t output_capacity, size_t *output_size) {
  return guarded([&]() -> chi_status_t {
    CHI_HANDLE(rt);
    chi::Executor *exec = nullptr;
    chi::FutureParts p;
    chi::Client *client;
    chi::Runtime *e = nullptr;
    if (chi_status_t s = resolve_future(rt, future, &exec, &p, &client, &e); s != CHI_OK) return s;
    if (client) return client->wait(p.slot, p.gen, timeout_ns, output, output_capacity, output_size);
    chi_status_t s = exec->wait(p.slot, p.gen, timeout_ns, output, output_capacity, output_size);
    count_gpu_result(e, p, s);
    return s;
  });
}

namespace {

bool cpu_future_of(const chi::Runtime *e, chi_future_t f) {
  chi::FutureParts p;
  return chi::decode_future(f, &p) && p.tag == e->tag() && p.pool == chi::kCpuPool;
}

// One future of chi_wait_batch outside the CPU pool's batched path: a test
// first tells a stale future (the batch stops) from a task whose handler
// returned CHI_ERR_INVALID (a result).  CHI_OK once a result was taken.
chi_status_t wait_one(chi::Executor *exec, const chi::FutureParts &p, chi::Client *client,
                      chi::Runtime *e, int64_t timeout_ns, int64_t since_ns, chi_task_result_t *r) {
  int finished = 0;
  chi_status_t s = client ? client->test(p.slot, p.gen, &finished) : exec->test(p.slot, p.gen, &finished);
  if (s != CHI_OK) return r->status = s;
  int64_t left = timeout_ns;
  if (timeout_ns > 0) left = std::max<int64_t>(0, timeout_ns - (chi::now_ns() - since_ns));
  s = client ? client->wait(p.slot, p.gen, left, r->output, r->output_capacity, &r->output_size)
             : exec->wait(p.slot, p.gen, left, r->output, r->output_capacity, &r->output_size);
  if (!client) count_gpu_result(e, p, s);
  r->status = s;
  return s == CHI_ERR_TIMEOUT || s == CHI_ERR_TOO_LARGE || s == CHI_ERR_DISCONNECTED ? s : CHI_OK;
}

}  // namespace

CHI_API chi_status_t chi_wait_batch(chi_runtime_t *rt, const chi_future_t *futures, size_t n,
                                    int64_t timeout_ns, chi_task_result_t *results,
                                    size_t *done) {
  if (done) *done = 0;
  return guarded([&]() -> chi_status_t {
    CHI_HANDLE(rt);
    if (chi_status_t s = check_batch(n, futures, "futures", results, "results"); s != CHI_OK) return s;
    const int64_t since = timeout_ns > 0 ? chi::now_ns() : 0;
    size_t i = 0;
    chi_status_t s = CHI_OK;
    while (i < n) {
      chi::Executor *exec = nullptr;
      chi::FutureParts p;
      chi::Client *client;
      chi::Runtime *e = nullptr;
      if ((s = resolve_future(rt, futures[i], &exec, &p, &client, &e)) != CHI_OK) {
        results[i].status = s;
        break;
      }
      if (!client && p.pool == chi::kCpuPool) {
        // The run of CPU futures from here goes to the pool in one call.
        size_t j = i + 1;
        while (j < n && cpu_future_of(e, futures[j])) ++j;
        size_t taken = 0;
        s = e->cpu().wait_batch(futures + i, j - i, timeout_ns, since, results + i, &taken);
        i += taken;
        if (s != CHI_OK) break;
        continue;
      }
      if ((s = wait_one(exec, p, client, e, timeout_ns, since, &results[i])) != CHI_OK) break;
      ++i;
    }
    if (done) *done = i;
    return s == CHI_OK ? s : at_index(s, "futures", i);
  });
}

CHI_API chi_status_t chi_test(chi_runtime_t *rt, chi_future_t future, int *done) {
  return guarded([&]() -> chi_status_t {
    CHI_HANDLE(rt);
    CHI_NONNULL(done);
    chi::Executor *exec = nullptr;
    chi::FutureParts p;
    chi::Client *client;
    chi::Runtime *e = nullptr;
    if (chi_status_t s = resolve_future(rt, future, &exec, &p, &client, &e); s != CHI_OK) return s;
    if (client) return client->test(p.slot, p.gen, done);
    return exec->test(p.slot, p.gen, done);
  });
}

CHI_API chi_status_t chi_release(chi_runtime_t *rt, chi_future_t future) {
  return guarded([&]() -> chi_status_t {
    CHI_HANDLE(rt);
    chi::Executor *exec = nullptr;
    chi::FutureParts p;
    chi::Client *client;
    chi::Runtime *e = nullptr;
    if (chi_status_t s = resolve_future(rt, future, &exec, &p, &client, &e); s != CHI_OK) return s;
    if (client) return client->release(p.slot, p.gen);
    chi_status_t s = exec->release(p.slot, p.gen);
    if (s == CHI_OK) count_gpu_result(e, p, CHI_OK);  // released: counted as completed
    return s;
  });
}

namespace {

// chi_load_module with the GPUs paused.
chi_status_t load_module_paused(chi_runtime_t *rt, chi::Runtime *e, const char *path) {
  void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char *why = dlerror();
    return set_error(CHI_ERR_NOT_FOUND, "cannot load module '%s': %s", path, why ? why : "?");
  }
  auto init = reinterpret_cast<chi_module_init_t>(dlsym(handle, "chimaera_module_init"));
  if (!init) {
    dlclose(handle);
    return set_error(CHI_ERR_NOT_FOUND, "module '%s' exports no chimaera_module_init", path);
  }
  {
    std::lock_guard<std::mutex> lock(e->modules_mutex());
    e->modules().push_back(handle);
  }
  // The module stays loaded even if its init fails: it may have registered
  // handlers before failing, and those must stay callable.
  chi_status_t s = init(rt, CHI_VERSION_NUMBER);
  if (s != CHI_OK)
    return set_error(s, "module '%s': chimaera_module_init returned %d (%s)", path, s,
                     chi_status_string(s));
  return CHI_OK;
}

}  // namespace

CHI_API chi_status_t chi_load_module(chi_runtime_t *rt, const char *path) {
  return guarded([&]() -> chi_status_t {
    CHI_HANDLE(rt);
    CHI_NONNULL(path);
    chi::Runtime *e;
    if (chi_status_t s = local_engine(rt, true, &e); s != CHI_OK) return s;
    // A module may bring device code: the first CUDA call after its dlopen
    // loads that code, which waits for every running kernel.  The
    // orchestrators pause for the load and init (their queues keep what is
    // submitted meanwhile) and resume after, with the module's orchestrator
    // if its init set one.
    std::vector<int32_t> paused;
    if (e->gpu())
      if (chi_status_t s = e->gpu()->pause_running(&paused); s != CHI_OK) return s;
    chi_status_t s = load_module_paused(rt, e, path);
    const std::string why = s == CHI_OK ? std::string() : chi::last_error();
    for (int32_t g : paused)
      if (chi_status_t r = e->gpu()->resume(g); r != CHI_OK && s == CHI_OK) return r;
    if (s != CHI_OK) return set_error(s, "%s", why.c_str());
    return CHI_OK;
  });
}

CHI_API chi_status_t chi_register_gpu_mem(chi_runtime_t *rt, int32_t gpu, void *device_ptr,
                                          size_t size, uint64_t *region) {
  return guarded([&]() -> chi_status_t {
    CHI_HANDLE(rt);
    CHI_NONNULL(device_ptr);
    CHI_NONNULL(region);
    if (size == 0) return set_error(CHI_ERR_INVALID, "region size is 0");
    if (reinterpret_cast<uintptr_t>(device_ptr) + size < reinterpret_cast<uintptr_t>(device_ptr))
      return set_error(CHI_ERR_INVALID, "region wraps around the address space");
    if (gpu < 0 && gpu != CHI_ROUTE_CPU)
      return set_error(CHI_ERR_INVALID, "gpu must be >= 0 or CHI_ROUTE_CPU, not %d", gpu);
    if (rt->client && gpu != CHI_ROUTE_CPU) return rt->client->register_gpu_mem(gpu, device_ptr, size, region);
    chi::Runtime *e;
    if (chi_status_t s = local_engine(rt, true, &e); s != CHI_OK) return s;
    if (gpu == CHI_ROUTE_CPU) return e->regions().add(gpu, device_ptr, size, region);
    if (gpu < 0) return set_error(CHI_ERR_INVALID, "gpu must be >= 0 or CHI_ROUTE_CPU, not %d", gpu);
    chi::GpuSystem *g = e->gpu();
    if (!g) return set_error(CHI_ERR_NO_DEVICE, "GPU %d: this runtime has no GPU", gpu);
    if (gpu >= g->count())
      return set_error(CHI_ERR_INVALID, "GPU %d out of range: this runtime drives %d GPU(s)", gpu,
                       g->count());
    if (chi_status_t s = g->check_device_pointer(gpu, device_ptr, size); s != CHI_OK) return s;
    if (chi_status_t s = e->regions().add(gpu, device_ptr, size, region); s != CHI_OK) return s;
    return g->regions_changed();
  });
}

CHI_API chi_status_t chi_unregister_mem(chi_runtime_t *rt, uint64_t region) {
  return guarded([&]() -> chi_status_t {
    CHI_HANDLE(rt);
    if (rt->client && rt->client->server_region(region)) return rt->client->unregister_server_mem(region);
    chi::Runtime *e;
    if (local_engine(rt, false, &e) != CHI_OK)
      return set_error(CHI_ERR_INVALID, "unknown region %llu", (unsigned long long)region);
    if (chi_status_t s = e->regions().remove(region); s != CHI_OK) return s;
    return e->gpu() ? e->gpu()->regions_changed() : CHI_OK;
  });
}

CHI_API chi_status_t chi_mem_resolve(chi_runtime_t *rt, const chi_mem_ref_t *ref, void **ptr,
                                     int32_t *gpu) {
  return guarded([&]() -> chi_status_t {
    CHI_HANDLE(rt);
    CHI_NONNULL(ref);
    CHI_NONNULL(ptr);
    if (rt->client && rt->client->server_region(ref->region))
      return set_error(CHI_ERR_INVALID,
                       "region %llu is device memory registered with the server: its handlers resolve it",
                       (unsigned long long)ref->region);
    chi::Runtime *e;
    if (local_engine(rt, false, &e) != CHI_OK)
      return set_error(CHI_ERR_INVALID, "unknown region %llu", (unsigned long long)ref->region);
    return e->regions().resolve(*ref, ptr, gpu);
  });
}

CHI_API chi_status_t chi_gpu_count(chi_runtime_t *rt, int32_t *count) {
  return guarded([&]() -> chi_status_t {
    CHI_HANDLE(rt);
    CHI_NONNULL(count);
    if (rt->client) {
      *count = rt->client->gpus();
      return CHI_OK;
    }
    *count = rt->engine->gpu() ? rt->engine->gpu()->count() : 0;
    return CHI_OK;
  });
}

CHI_API chi_status_t chi_stats(chi_runtime_t *rt, chi_stats_t *stats) {
  return guarded([&]() -> chi_status_t {
    CHI_HANDLE(rt);
    CHI_NONNULL(stats);
    if (stats->struct_size < offsetof(chi_stats_t, workers))
      return set_error(CHI_ERR_INVALID, "chi_stats_t.struct_size %zu is too small (want %zu)",
                       stats->struct_size, sizeof(chi_stats_t));
    if (rt->client) return rt->client->stats(stats);
    chi_stats_t st;
    rt->engine->read_stats(&st);
    size_t keep = std::min(stats->struct_size, sizeof st);
    st.struct_size = stats->struct_size;
    std::memcpy(stats, &st, keep);
    return CHI_OK;
  });
}

CHI_API chi_status_t chi_server_start(chi_runtime_t *rt, const char *address, chi_server_t **srv) {
  return guarded([&]() -> chi_status_t {
    CHI_ENGINE(rt, e);
    CHI_NONNULL(srv);
    *srv = nullptr;
    if (e->stopping()) return set_error(CHI_ERR_SHUTDOWN, "runtime is shutting down");
    std::vector<std::string> addresses;
    if (address) addresses.push_back(address);
    else addresses = e->config().server.listen;
    if (addresses.empty()) addresses.push_back("");  // this user's default server
    chi::Server *s;
    if (chi_status_t st = chi::Server::start(*e, addresses, &s); st != CHI_OK) return st;
    // Without MPS, every other process's kernels on these GPUs are
    // time-sliced against the orchestrator (docs/server.md, "GPUs shared by
    // processes").
    std::string mps_dir;
    if (e->gpu() && e->gpu()->count() > 0 && !e->gpu()->mps_active(&mps_dir))
      chi::log(chi::LogLevel::kWarn,
               "serving %d GPU(s) without MPS (no control daemon at %s): other processes' "
               "kernels on them are time-sliced against the orchestrator (measured on an H100: "
               "a kernel launch + sync 2.2 ms instead of 12 us); start nvidia-cuda-mps-control "
               "before the server and its clients (scripts/mps.sh)",
               int(e->gpu()->count()), mps_dir.c_str());
    {
      std::lock_guard<std::mutex> lock(rt->servers_mu);
      rt->servers.push_back(s);
    }
    *srv = reinterpret_cast<chi_server_t *>(s);
    return CHI_OK;
  });
}

CHI_API chi_status_t chi_server_query(const char *address, const char *request, char *reply,
                                      size_t capacity, size_t *reply_size) {
  return guarded([&]() -> chi_status_t {
    CHI_NONNULL(request);
    if (reply && capacity) reply[0] = 0;
    if (reply_size) *reply_size = 0;
    chi::ipc::Op op;
    uint16_t flags = 0;
    std::string req = request;
    if (req == "ping") op = chi::ipc::Op::kPing;
    else if (req == "status") op = chi::ipc::Op::kStatus;
    else if (req == "status-json") op = chi::ipc::Op::kStatus, flags = 1;
    else if (req == "stop") op = chi::ipc::Op::kStop;
    else return set_error(CHI_ERR_INVALID, "unknown request '%.32s' (ping, status, status-json, stop)", request);
    std::unique_ptr<chi::Client> c;
    if (chi_status_t s = chi::connect_control(address ? address : "", &c); s != CHI_OK) return s;
    // A reply is at most one frame's payload (the ZeroMQ server does not cut
    // status at 64 KiB as the shm one does); control() reports the reply's
    // full length, which only the bytes it copied may be read up to.
    std::string buf(chi::ipc::kMaxFramePayload, '\0');
    uint32_t n = 0;
    if (chi_status_t s = c->control(op, flags, nullptr, 0, buf.data(), uint32_t(buf.size()), &n); s != CHI_OK)
      return s;
    if (reply_size) *reply_size = n;
    if (n > buf.size())
      return set_error(CHI_ERR_PROTOCOL, "%s answered with %u bytes, more than a reply may hold (%zu)",
                       address && *address ? address : "the server", n, buf.size());
    if (reply && capacity) {
      size_t k = std::min<size_t>(n, capacity - 1);
      std::memcpy(reply, buf.data(), k);
      reply[k] = 0;
      if (k < n) return set_error(CHI_ERR_TOO_LARGE, "reply of %u bytes truncated to %zu", n, k);
    }
    return CHI_OK;
  });
}

CHI_API chi_status_t chi_server_stop(chi_server_t *srv, uint32_t drain_timeout_ms) {
  if (!srv) return CHI_OK;
  return guarded([&]() -> chi_status_t {
    return reinterpret_cast<chi::Server *>(srv)->stop(drain_timeout_ms);
  });
}

CHI_API chi_status_t chi_server_wait_stop_request(chi_server_t *srv, int64_t timeout_ms) {
  return guarded([&]() -> chi_status_t {
    CHI_NONNULL(srv);
    return reinterpret_cast<chi::Server *>(srv)->wait_stop_request(timeout_ms);
  });
}

namespace {

// Common checks of the per-GPU calls; gpu == -1 means every GPU where allowed.
chi_status_t gpu_target(chi::Runtime *e, int32_t gpu, bool allow_all, chi::GpuSystem **g) {
  *g = e->gpu();
  if (!*g) return set_error(CHI_ERR_NO_DEVICE, "this runtime has no GPU");
  if ((gpu == -1 && allow_all) || (gpu >= 0 && gpu < (*g)->count())) return CHI_OK;
  return set_error(CHI_ERR_INVALID, "GPU %d out of range: this runtime drives %d GPU(s)", gpu,
                   (*g)->count());
}

}  // namespace

CHI_API chi_status_t chi_gpu_context(chi_runtime_t *rt, int32_t gpu, chi_dev_context_t *ctx) {
  return guarded([&]() -> chi_status_t {
    CHI_HANDLE(rt);
    CHI_NONNULL(ctx);
    if (rt->client) return rt->client->gpu_context(gpu, ctx);
    chi::Runtime *e = rt->engine;
    chi::GpuSystem *g;
    if (chi_status_t s = gpu_target(e, gpu, false, &g); s != CHI_OK) return s;
    return g->context(gpu, ctx);
  });
}

CHI_API chi_status_t chi_gpu_pause(chi_runtime_t *rt, int32_t gpu) {
  return guarded([&]() -> chi_status_t {
    CHI_HANDLE(rt);
    if (rt->client) return client_gpu_refusal("chi_gpu_pause");
    chi::Runtime *e = rt->engine;
    chi::GpuSystem *g;
    if (chi_status_t s = gpu_target(e, gpu, true, &g); s != CHI_OK) return s;
    return g->pause(gpu);
  });
}

CHI_API chi_status_t chi_gpu_resume(chi_runtime_t *rt, int32_t gpu) {
  return guarded([&]() -> chi_status_t {
    CHI_HANDLE(rt);
    if (rt->client) return client_gpu_refusal("chi_gpu_resume");
    chi::Runtime *e = rt->engine;
    chi::GpuSystem *g;
    if (chi_status_t s = gpu_target(e, gpu, true, &g); s != CHI_OK) return s;
    return g->resume(gpu);
  });
}

CHI_API chi_status_t chi_gpu_set_orchestrator(chi_runtime_t *rt, int32_t gpu,
                                              const chi_gpu_orchestrator_t *orch) {
  return guarded([&]() -> chi_status_t {
    CHI_HANDLE(rt);
    if (rt->client) return client_gpu_refusal("chi_gpu_set_orchestrator");
    chi::Runtime *e = rt->engine;
    CHI_NONNULL(orch);
    if (orch->struct_size < sizeof(chi_gpu_orchestrator_t))
      return set_error(CHI_ERR_INVALID, "orchestrator struct_size %zu < %zu", orch->struct_size,
                       sizeof(chi_gpu_orchestrator_t));
    if (!orch->launch) return set_error(CHI_ERR_INVALID, "orchestrator launch function is NULL");
    if (orch->method_count && !orch->method_names)
      return set_error(CHI_ERR_INVALID, "orchestrator method_names is NULL");
    chi::GpuSystem *g;
    if (chi_status_t s = gpu_target(e, gpu, true, &g); s != CHI_OK) return s;
    return g->set_orchestrator(gpu, orch);
  });
}

}  // extern "C"
