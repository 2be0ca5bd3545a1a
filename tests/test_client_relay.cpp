// The relay behind client kernels (docs/server.md, "Client kernels"), without
// a GPU: with CHI_RELAY_HOST_MEMORY=1 a client's chi_gpu_context puts the
// relay in plain host memory, and this test plays the kernel's part, writing
// GPU->CPU ring entries (route in the slot word, chimaera/device_layout.h)
// and reading the reply records as chi_dev_wait would.  Over shm, ipc and
// tcp: the server's methods, large payloads, the client's own handler (and
// its refusal on a GPU route), unknown methods, a GPU route the server
// cannot serve, a slow task that does not hold up a quick one, many tasks at
// once; then a server SIGKILLed under pending tasks: every one, and every
// later one, answered CHI_ERR_DISCONNECTED.
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>
extern "C" {
#include <cmocka.h>
}

#include <cstring>
#include <string>
#include <vector>

#include "common.h"
#include "gpu/ll.h"
#include "spawn.h"

namespace {

using namespace chi::gpu;

chi_status_t sleep_handler(chi_request_t *req, void *) {
  uint64_t us = 0;
  if (req->input_size >= sizeof us) memcpy(&us, req->input, sizeof us);
  usleep(useconds_t(us));
  req->output_size = 0;
  return CHI_OK;
}

chi_status_t triple(chi_request_t *req, void *) {
  if (req->input_size != 8 || req->source != 0) return -1001;  // source: the GPU id
  uint64_t v;
  memcpy(&v, req->input, 8);
  v *= 3;
  memcpy(req->output, &v, 8);
  req->output_size = 8;
  return CHI_OK;
}

// The kernel's side of one relay context.
struct Ring {
  chi_dev_ctx_layout_t l;
  uint64_t ticket = 0;
  uint32_t gens[1u << 14] = {};
};

// Publishes a task into slot `slot` as cpu_publish does; returns its generation.
uint32_t put(Ring &r, chi_route_t route, chi_method_t method, const void *in, uint32_t n, uint32_t slot) {
  const uint32_t gen = r.gens[slot] = next_gen(r.gens[slot]);
  uint64_t *e = r.l.d2h_ring + (r.ticket & (r.l.d2h_ring_entries - 1)) * CHI_DEV_LL_WORDS;
  const uint32_t flag = uint32_t(r.ticket) + 1;
  if (n <= CHI_DEV_LL_INLINE) ll_put_payload(e, in, n, flag);
  else memcpy(r.l.d2h_buf + uint64_t(slot) * r.l.payload_stride, in, n);
  ll_store(e + 3, ll_pack(gen, flag));
  ll_store(e + 2, ll_pack(slot | (uint32_t(route + CHI_DEV_ROUTE_BIAS) << CHI_DEV_SLOT_BITS), flag));
  ll_store(e + 1, ll_pack(n, flag));
  ll_store(e, ll_pack(method, flag));
  ++r.ticket;
  return gen;
}

bool replied(const Ring &r, uint32_t slot) {
  const uint64_t *rec = r.l.d2h_reply + uint64_t(slot) * CHI_DEV_LL_WORDS;
  return ll_flag(ll_load(rec)) == r.gens[slot] && ll_flag(ll_load(rec + 1)) == r.gens[slot];
}

// Waits for the reply of `slot` (no bound of its own: ctest's timeout is the bound).
chi_status_t reply(const Ring &r, uint32_t slot, void *out, uint32_t *n) {
  const uint64_t *rec = r.l.d2h_reply + uint64_t(slot) * CHI_DEV_LL_WORDS;
  while (!replied(r, slot)) usleep(20);
  const chi_status_t s = chi_status_t(ll_data(ll_load(rec)));
  *n = ll_data(ll_load(rec + 1));
  if (*n <= CHI_DEV_LL_INLINE) {
    reply_get_inline(rec, out, *n);
    if (*n > 0 && *n <= CHI_DEV_REPLY_LL_OUTPUT) {
      // A small output is also in LL words 2-3, which a kernel's poll reads
      // with the header (device_layout.h): the same bytes, this generation.
      const uint64_t w2 = ll_load(rec + 2), w3 = ll_load(rec + 3);
      assert_int_equal(ll_flag(w2), r.gens[slot]);
      assert_int_equal(ll_flag(w3), r.gens[slot]);
      uint32_t ll[2] = {ll_data(w2), ll_data(w3)};
      assert_memory_equal(ll, out, *n);
    } else {
      // Otherwise they carry no generation: a poll may load them before the
      // next reply of this slot, so they must never keep an older one's.
      assert_int_equal(ll_flag(ll_load(rec + 2)), 0);
      assert_int_equal(ll_flag(ll_load(rec + 3)), 0);
    }
  } else {
    assert_int_equal(ll_flag(ll_load(rec + 2)), 0);
    assert_int_equal(ll_flag(ll_load(rec + 3)), 0);
    memcpy(out, r.l.d2h_buf + uint64_t(slot) * r.l.payload_stride, *n);
  }
  return s;
}

chi_runtime_t *connect(const std::string &address) {
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.mode = CHI_MODE_CLIENT;
  cfg.server_address = address.c_str();
  chi_runtime_t *rt = nullptr;
  assert_status(CHI_OK, chi_init(&cfg, &rt));
  return rt;
}

void context(chi_runtime_t *c, Ring *r) {
  chi_dev_context_t ctx;
  assert_status(CHI_OK, chi_gpu_context(c, 0, &ctx));
  memcpy(&r->l, &ctx, sizeof r->l);
  assert_int_equal(r->l.magic, CHI_DEV_CTX_MAGIC);
  assert_true(r->l.flags & CHI_DEV_CTX_RELAY);
  assert_true(r->l.slots <= (1u << 14));
}

// ipc:// sockets live in a folder of this process's own, not in /tmp itself,
// where another user could bind the path first.
std::string g_ipc_dir;

std::vector<std::string> addresses(const char *what) {
  const std::string n = std::string(what) + "-" + std::to_string(getpid());
  return {"shm://relay-" + n, "ipc://" + g_ipc_dir + "/relay-" + n + ".ipc",
          "tcp://127.0.0.1:" + std::to_string(23000 + (getpid() % 500) * 4 + (what[0] & 3))};
}

void test_routes(void **) {
  for (const std::string &address : addresses("routes")) {
    chi_runtime_t *srv_rt = chi_test_init(2, nullptr);
    chi_method_t sleep_m = 0;
    assert_status(CHI_OK, chi_register_handler(srv_rt, "relay.sleep", sleep_handler, nullptr, &sleep_m));
    chi_server_t *srv = nullptr;
    assert_status(CHI_OK, chi_server_start(srv_rt, address.c_str(), &srv));
    chi_runtime_t *c = connect(address);
    chi_method_t mine = 0, slow = 0;
    assert_status(CHI_OK, chi_register_handler(c, "relay.triple", triple, nullptr, &mine));
    assert_status(CHI_OK, chi_method_lookup(c, "relay.sleep", &slow));
    Ring *r = new Ring;
    context(c, r);
    uint8_t out[4096];
    uint32_t n = 0;
    // The server's built-ins, on the CPU route.
    uint64_t in[2] = {40, 2};
    put(*r, CHI_ROUTE_CPU, CHI_METHOD_ADD, in, sizeof in, 5);
    assert_status(CHI_OK, reply(*r, 5, out, &n));
    uint64_t sum;
    memcpy(&sum, out, 8);
    assert_int_equal(n, 8);
    assert_true(sum == 42);
    // A payload over the 112 inline bytes both ways (the slot's buffer).
    std::vector<uint8_t> big(3000);
    for (size_t i = 0; i < big.size(); ++i) big[i] = uint8_t(i * 13);
    put(*r, CHI_ROUTE_CPU, CHI_METHOD_ECHO, big.data(), uint32_t(big.size()), 6);
    assert_status(CHI_OK, reply(*r, 6, out, &n));
    assert_int_equal(n, big.size());
    assert_memory_equal(out, big.data(), big.size());
    // The client's own handler runs in the client, with source = the GPU.
    uint64_t v = 14;
    put(*r, CHI_ROUTE_CPU, mine, &v, 8, 7);
    assert_status(CHI_OK, reply(*r, 7, out, &n));
    memcpy(&v, out, 8);
    assert_true(v == 42);
    // ... and is on no GPU route.
    put(*r, CHI_ROUTE_LOCAL, mine, &v, 8, 7);
    assert_status(CHI_ERR_NOT_FOUND, reply(*r, 7, out, &n));
    // Reply words 2-3 after a generation cycle of the slot (issue 49): an
    // 8-byte reply of generation g, a 16-byte one, then the slot back at g
    // (as after 2^24-1 uses).  A kernel's poll before the new reply must not
    // find words 2-3 carrying g: it would take the old output as the new.
    v = 5;
    const uint32_t g = put(*r, CHI_ROUTE_CPU, mine, &v, 8, 12);
    assert_status(CHI_OK, reply(*r, 12, out, &n));
    put(*r, CHI_ROUTE_CPU, CHI_METHOD_ADD, in, sizeof in, 12);
    assert_status(CHI_OK, reply(*r, 12, out, &n));
    r->gens[12] = g > 1 ? g - 1 : 0xFFFFFFu;
    const uint64_t *rec12 = r->l.d2h_reply + 12u * CHI_DEV_LL_WORDS;
    assert_int_not_equal(ll_flag(ll_load(rec12 + 2)), g);
    assert_int_not_equal(ll_flag(ll_load(rec12 + 3)), g);
    v = 7;
    assert_int_equal(put(*r, CHI_ROUTE_CPU, mine, &v, 8, 12), g);
    assert_status(CHI_OK, reply(*r, 12, out, &n));
    memcpy(&v, out, 8);
    assert_true(n == 8 && v == 21);
    // Refusals come back at the wait: an unknown method, a GPU the server lacks.
    put(*r, CHI_ROUTE_CPU, 0x3FFFFF00u, in, sizeof in, 8);
    assert_status(CHI_ERR_NOT_FOUND, reply(*r, 8, out, &n));
    put(*r, CHI_ROUTE_GPU_ANY, CHI_METHOD_ECHO, in, sizeof in, 9);
    assert_status(CHI_ERR_NO_DEVICE, reply(*r, 9, out, &n));
    put(*r, CHI_ROUTE_LOCAL, CHI_METHOD_ECHO, in, sizeof in, 9);
    assert_status(CHI_ERR_NO_DEVICE, reply(*r, 9, out, &n));
    // A slow task does not hold up the quick one behind it.
    uint64_t us = 1000000;
    put(*r, CHI_ROUTE_CPU, slow, &us, 8, 10);
    put(*r, CHI_ROUTE_CPU, CHI_METHOD_ADD, in, sizeof in, 11);
    assert_status(CHI_OK, reply(*r, 11, out, &n));
    assert_false(replied(*r, 10));
    assert_status(CHI_OK, reply(*r, 10, out, &n));
    // Many at once, answered in any order.
    const uint32_t many = 2000;
    for (uint32_t i = 0; i < many; ++i) {
      uint64_t ab[2] = {i, 1000000};
      put(*r, i % 3 ? CHI_ROUTE_CPU : CHI_ROUTE_LOCAL, i % 3 ? CHI_METHOD_ADD : mine, ab, i % 3 ? 16 : 8,
          100 + i);
    }
    for (uint32_t i = 0; i < many; ++i) {
      const chi_status_t s = reply(*r, 100 + i, out, &n);
      if (i % 3 == 0) {
        assert_status(CHI_ERR_NOT_FOUND, s);  // the client's handler on LOCAL
        continue;
      }
      assert_status(CHI_OK, s);
      memcpy(&sum, out, 8);
      assert_true(sum == i + 1000000ull);
    }
    assert_status(CHI_OK, chi_finalize(c));
    delete r;
    assert_status(CHI_OK, chi_finalize(srv_rt));
  }
}

std::string g_self;  // this program, re-executed for the server child

// The server child (`test_client_relay server-child ADDRESS FD`): serves
// ADDRESS, writes one byte to FD once it does, and runs until killed.
int server_child(const char *address, int ready) {
  chi_runtime_t *rt = chi_test_init(2, nullptr);
  chi_method_t m;
  chi_server_t *srv;
  if (chi_register_handler(rt, "relay.sleep", sleep_handler, nullptr, &m) != CHI_OK ||
      chi_server_start(rt, address, &srv) != CHI_OK)
    return 1;
  if (write(ready, "R", 1) != 1) return 1;
  for (;;) pause();
}

// A server in a child process (so that it can be SIGKILLed): this program
// again (tests/spawn.h: nothing runs between fork and exec).  The child's
// end of the pipe is inherited (no O_CLOEXEC); ours is not.
pid_t server_process(const std::string &address) {
  int ready[2];
  assert_int_equal(pipe(ready), 0);
  assert_int_equal(fcntl(ready[0], F_SETFD, FD_CLOEXEC), 0);
  pid_t pid = chi_test_spawn({g_self, "server-child", address, std::to_string(ready[1])});
  close(ready[1]);
  assert_true(pid > 0);
  char ch = 0;
  assert_int_equal(read(ready[0], &ch, 1), 1);
  close(ready[0]);
  return pid;
}

void test_server_death(void **) {
  std::vector<std::string> all = addresses("death");
  all.pop_back();  // tcp: a killed peer looks the same as on ipc (ZeroMQ's disconnect)
  for (const std::string &address : all) {
    pid_t srv = server_process(address);
    chi_runtime_t *c = connect(address);
    chi_method_t slow = 0;
    assert_status(CHI_OK, chi_method_lookup(c, "relay.sleep", &slow));
    Ring *r = new Ring;
    context(c, r);
    uint64_t us = 20000000;  // far longer than the test
    for (uint32_t i = 0; i < 8; ++i) put(*r, CHI_ROUTE_CPU, slow, &us, 8, i);
    usleep(100000);  // the tasks reach the server (none replied: they sleep)
    for (uint32_t i = 0; i < 8; ++i) assert_false(replied(*r, i));
    kill(srv, SIGKILL);
    int st;
    waitpid(srv, &st, 0);
    uint8_t out[64];
    uint32_t n;
    for (uint32_t i = 0; i < 8; ++i) assert_status(CHI_ERR_DISCONNECTED, reply(*r, i, out, &n));
    uint64_t in[2] = {1, 2};
    put(*r, CHI_ROUTE_CPU, CHI_METHOD_ADD, in, sizeof in, 20);
    assert_status(CHI_ERR_DISCONNECTED, reply(*r, 20, out, &n));
    put(*r, CHI_ROUTE_LOCAL, CHI_METHOD_ADD, in, sizeof in, 21);
    assert_status(CHI_ERR_DISCONNECTED, reply(*r, 21, out, &n));
    chi_finalize(c);
    delete r;
  }
}

}  // namespace

int main(int argc, char **argv) {
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) return 1;
  self[len] = '\0';
  g_self = self;
  if (argc == 4 && !strcmp(argv[1], "server-child")) return server_child(argv[2], atoi(argv[3]));
  setenv("CHI_RELAY_HOST_MEMORY", "1", 1);
  char dir[] = "/tmp/chi-relay-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  g_ipc_dir = dir;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_routes),
      cmocka_unit_test(test_server_death),
  };
  const int rc = cmocka_run_group_tests(tests, nullptr, nullptr);
  const std::string cleanup = "rm -rf " + g_ipc_dir;
  return system(cleanup.c_str()) == 0 ? rc : (rc ? rc : 1);
}
