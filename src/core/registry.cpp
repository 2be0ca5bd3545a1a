#include "core/registry.h"

#include <bitset>
#include <cstring>

#include "base/error.h"

namespace chi {

namespace {

// The first id past the built-ins, which every runtime registers first.
constexpr uint32_t kFirstUserMethod = CHI_METHOD_CHECKSUM + 1;

// Ids of the methods of live runtimes.  Next-fit from a moving cursor: a
// freed id comes back only after every other free id was handed out, so an
// id kept past its runtime's end is unlikely to name a method of a new one.
std::mutex g_ids_mu;
std::bitset<kMaxMethods> g_ids_used;
uint32_t g_id_next = kFirstUserMethod;

uint32_t acquire_method_id() {
  std::lock_guard<std::mutex> lock(g_ids_mu);
  const uint32_t span = kMaxMethods - kFirstUserMethod;
  for (uint32_t k = 0; k < span; ++k) {
    uint32_t id = kFirstUserMethod + (g_id_next - kFirstUserMethod + k) % span;
    if (!g_ids_used.test(id)) {
      g_ids_used.set(id);
      g_id_next = id + 1 < kMaxMethods ? id + 1 : kFirstUserMethod;
      return id;
    }
  }
  return 0;
}

void release_method_id(uint32_t id) {
  std::lock_guard<std::mutex> lock(g_ids_mu);
  g_ids_used.reset(id);
}

}  // namespace

bool method_id_in_use(chi_method_t id) {
  if (id < kFirstUserMethod || id >= kMaxMethods) return false;
  std::lock_guard<std::mutex> lock(g_ids_mu);
  return g_ids_used.test(id);
}

chi_status_t check_method_name(const char *name) {
  if (!name) return set_error(CHI_ERR_INVALID, "method name is NULL");
  size_t n = strnlen(name, kMaxMethodName + 1);
  if (n == 0) return set_error(CHI_ERR_INVALID, "method name is empty");
  if (n > kMaxMethodName)
    return set_error(CHI_ERR_INVALID, "method name longer than %zu bytes", kMaxMethodName);
  for (size_t i = 0; i < n; ++i) {
    unsigned char c = static_cast<unsigned char>(name[i]);
    if (c < 0x21 || c > 0x7E)
      return set_error(CHI_ERR_INVALID, "method name has a non-printable or space byte at %zu", i);
  }
  return CHI_OK;
}

Registry::Registry() = default;

Registry::~Registry() {
  for (auto &c : chunks_) {
    MethodEntry *chunk = c.load(std::memory_order_relaxed);
    if (!chunk) continue;
    for (uint32_t i = 0; i < kChunk; ++i) {
      uint32_t id = uint32_t(&c - chunks_) * kChunk + i;
      if (id >= kFirstUserMethod && chunk[i].live.load(std::memory_order_relaxed))
        release_method_id(id);
    }
    delete[] chunk;
  }
}

MethodEntry *Registry::entry_for(chi_method_t id) {
  std::atomic<MethodEntry *> &c = chunks_[id / kChunk];
  MethodEntry *chunk = c.load(std::memory_order_relaxed);
  if (!chunk) {
    chunk = new MethodEntry[kChunk];
    c.store(chunk, std::memory_order_release);
  }
  return &chunk[id % kChunk];
}

chi_status_t Registry::add(const char *name, bool cpu, chi_handler_t fn, void *user_data,
                           chi_method_t *id) {
  if (chi_status_t s = check_method_name(name); s != CHI_OK) return s;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_name_.find(name);
  if (it != by_name_.end()) {
    MethodEntry &e = *entry_for(it->second);
    bool taken = cpu ? e.cpu_fn.load() != nullptr : e.gpu.load();
    if (taken)
      return set_error(CHI_ERR_INVALID, "method '%s' already has a %s handler", name,
                       cpu ? "CPU" : "GPU");
    if (cpu) {
      e.user_data.store(user_data, std::memory_order_relaxed);
      e.cpu_fn.store(fn, std::memory_order_release);
    } else {
      e.gpu.store(true, std::memory_order_release);
    }
    if (id) *id = it->second;
    return CHI_OK;
  }
  // The built-ins are registered first, under their fixed ids; every other
  // name takes an id no other live runtime holds.
  uint32_t next = builtins_ < kFirstUserMethod ? builtins_++ : acquire_method_id();
  if (next == 0)
    return set_error(CHI_ERR_NOMEM, "method table full: the live runtimes of this process hold %u methods",
                     kMaxMethods - kFirstUserMethod);
  MethodEntry *e;
  try {
    e = entry_for(next);
    by_name_.emplace(name, next);
  } catch (...) {  // out of memory: nothing is published yet
    if (next >= kFirstUserMethod) release_method_id(next);
    throw;
  }
  std::memcpy(e->name, name, strlen(name) + 1);
  e->user_data.store(user_data, std::memory_order_relaxed);
  e->cpu_fn.store(cpu ? fn : nullptr, std::memory_order_relaxed);
  e->gpu.store(!cpu, std::memory_order_relaxed);
  e->live.store(true, std::memory_order_release);  // publishes the entry
  if (next + 1 > limit_.load(std::memory_order_relaxed))
    limit_.store(next + 1, std::memory_order_release);
  if (id) *id = next;
  return CHI_OK;
}

chi_status_t Registry::add_cpu(const char *name, chi_handler_t fn, void *user_data,
                               chi_method_t *id) {
  if (!fn) return set_error(CHI_ERR_INVALID, "handler function is NULL");
  return add(name, true, fn, user_data, id);
}

chi_status_t Registry::add_gpu(const char *name, chi_method_t *id) {
  return add(name, false, nullptr, nullptr, id);
}

void Registry::mark_bounded(chi_method_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (MethodEntry *e = entry_for(id)) e->bounded.store(true, std::memory_order_release);
}

chi_status_t Registry::lookup(const char *name, chi_method_t *id) const {
  if (!name) return set_error(CHI_ERR_INVALID, "method name is NULL");
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return set_error(CHI_ERR_NOT_FOUND, "no method named '%s'", name);
  *id = it->second;
  return CHI_OK;
}

chi_status_t run_cpu_handler(const Registry &reg, chi_method_t method, chi_route_t source,
                             const void *input, size_t input_size, void *output,
                             size_t output_capacity, size_t *output_size) {
  *output_size = 0;
  const MethodEntry *e = reg.get(method);
  if (!e) {
    if (method_id_in_use(method))
      return set_error(CHI_ERR_NOT_FOUND, "method %u belongs to another runtime", method);
    return set_error(CHI_ERR_NOT_FOUND, "method %u is not registered", method);
  }
  chi_handler_t fn = e->cpu_fn.load(std::memory_order_acquire);
  if (!fn) return set_error(CHI_ERR_NOT_FOUND, "method '%s' has no CPU handler", e->name);
  chi_request_t req;
  // Built-ins keep their fixed ids everywhere.
  req.method = method > CHI_METHOD_CHECKSUM ? method | reg.id_bits() : method;
  req.source = source;
  req.input = input;
  req.input_size = input_size;
  req.output = output;
  req.output_capacity = output_capacity;
  req.output_size = 0;
  chi_status_t s = fn(&req, e->user_data.load(std::memory_order_relaxed));
  if (req.output_size > output_capacity) {
    return set_error(CHI_ERR_INTERNAL, "handler '%s' reported output_size %zu over capacity %zu",
                     e->name, req.output_size, output_capacity);
  }
  *output_size = req.output_size;
  if (s > 0)
    return set_error(CHI_ERR_INTERNAL, "handler '%s' returned positive status %d", e->name, s);
  if (s != CHI_OK) set_error(s, "handler '%s' returned %d", e->name, s);
  return s;
}

uint64_t fnv1a64(const void *data, size_t size) {
  const unsigned char *p = static_cast<const unsigned char *>(data);
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < size; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

namespace {

chi_status_t builtin_echo(chi_request_t *req, void *) {
  if (req->input_size > req->output_capacity) return CHI_ERR_TOO_LARGE;
  if (req->input_size) std::memcpy(req->output, req->input, req->input_size);
  req->output_size = req->input_size;
  return CHI_OK;
}

chi_status_t builtin_add(chi_request_t *req, void *) {
  if (req->input_size != 16 || req->output_capacity < 8) return CHI_ERR_INVALID;
  const unsigned char *in = static_cast<const unsigned char *>(req->input);
  uint64_t a = 0, b = 0;
  for (int i = 7; i >= 0; --i) {  // little-endian on every host
    a = (a << 8) | in[i];
    b = (b << 8) | in[8 + i];
  }
  uint64_t sum = a + b;
  unsigned char *out = static_cast<unsigned char *>(req->output);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(sum >> (8 * i));
  req->output_size = 8;
  return CHI_OK;
}

chi_status_t builtin_checksum(chi_request_t *req, void *) {
  if (req->output_capacity < 8) return CHI_ERR_TOO_LARGE;
  uint64_t h = fnv1a64(req->input, req->input_size);
  unsigned char *out = static_cast<unsigned char *>(req->output);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(h >> (8 * i));
  req->output_size = 8;
  return CHI_OK;
}

}  // namespace

void register_builtins(Registry &reg) {
  chi_method_t id;
  // Registered first, so their ids are CHI_METHOD_ECHO, _ADD, _CHECKSUM; the
  // GPU orchestrators serve them too.  Each is one pass over its input: bounded.
  const struct {
    const char *name;
    chi_handler_t fn;
  } builtins[] = {{"chi.echo", builtin_echo}, {"chi.add", builtin_add}, {"chi.checksum", builtin_checksum}};
  for (const auto &b : builtins) {
    reg.add_cpu(b.name, b.fn, nullptr, &id);
    reg.add_gpu(b.name, &id);
    reg.mark_bounded(id);
  }
}

}  // namespace chi
