/* The soak's server module (scripts/soak.sh): registers "soak.record".
 *
 * soak.record  input: a task id and its padding (soak_common.h); checks the
 *              padding, sets the id's bit in the ledger (the file named by
 *              $CHI_SOAK_LEDGER, mapped shared, so it outlives a killed
 *              server) and counts a second run of an id as a duplicate;
 *              output: { id, FNV-1a of the input }.
 *
 * In CUDA builds (soak_module_gpu.cu) "soak.record" also has a GPU handler,
 * installed as a user orchestrator when the runtime drives a GPU: it checks
 * the input and checksums it on the GPU, then records the id through a
 * GPU->CPU task to the CPU handler below (so GPU runs land in the same
 * ledger, and a second run is counted the same way); the CPU handler counts
 * the runs a GPU submitted (gpu_runs).
 *
 * The ledger is created on first use with $CHI_SOAK_SEQ_BITS (default 28)
 * bits of sequence per client and $CHI_SOAK_CLIENTS (default 8192) client
 * numbers; a restarted server maps the same file and keeps counting. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chimaera.h"
#include "soak_common.h"

#define SOAK_EXPORT __attribute__((visibility("default")))

#ifdef SOAK_MODULE_GPU
chi_status_t soak_module_install_gpu(chi_runtime_t *rt); /* soak_module_gpu.cu */
#endif

static soak_ledger_header_t *g_hdr;
static uint64_t *g_per_client;
static uint64_t *g_bitmap;
static uint32_t g_seq_bits, g_clients;

static uint32_t env_u32(const char *name, uint32_t dflt) {
  const char *v = getenv(name);
  return v && *v ? (uint32_t)strtoul(v, NULL, 10) : dflt;
}

static chi_status_t open_ledger(void) {
  const char *path = getenv("CHI_SOAK_LEDGER");
  if (!path || !*path) {
    fprintf(stderr, "soak module: CHI_SOAK_LEDGER names no file\n");
    return CHI_ERR_CONFIG;
  }
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0 || flock(fd, LOCK_EX) != 0) {
    fprintf(stderr, "soak module: %s: %s\n", path, strerror(errno));
    if (fd >= 0) close(fd);
    return CHI_ERR_CONFIG;
  }
  struct stat st;
  fstat(fd, &st);
  soak_ledger_header_t h;
  if (st.st_size == 0) {
    memset(&h, 0, sizeof h);
    h.magic = SOAK_MAGIC;
    h.seq_bits = env_u32("CHI_SOAK_SEQ_BITS", SOAK_DEFAULT_SEQ_BITS);
    h.clients = env_u32("CHI_SOAK_CLIENTS", SOAK_DEFAULT_CLIENTS);
    if (h.seq_bits < 6 || h.seq_bits > 32 || h.clients == 0 || h.clients > (1u << 20)) {
      fprintf(stderr, "soak module: bad CHI_SOAK_SEQ_BITS or CHI_SOAK_CLIENTS\n");
      close(fd);
      return CHI_ERR_CONFIG;
    }
    if (ftruncate(fd, (off_t)soak_ledger_size(h.seq_bits, h.clients)) != 0 ||
        pwrite(fd, &h, sizeof h, 0) != (ssize_t)sizeof h) {
      fprintf(stderr, "soak module: %s: %s\n", path, strerror(errno));
      close(fd);
      return CHI_ERR_CONFIG;
    }
  } else if (pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h || h.magic != SOAK_MAGIC ||
             (uint64_t)st.st_size != soak_ledger_size(h.seq_bits, h.clients)) {
    fprintf(stderr, "soak module: %s is not a soak ledger\n", path);
    close(fd);
    return CHI_ERR_CONFIG;
  }
  size_t size = soak_ledger_size(h.seq_bits, h.clients);
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd); /* the mapping keeps the file; the lock goes with the descriptor */
  if (p == MAP_FAILED) {
    fprintf(stderr, "soak module: mmap %s: %s\n", path, strerror(errno));
    return CHI_ERR_NOMEM;
  }
  g_hdr = (soak_ledger_header_t *)p;
  g_per_client = (uint64_t *)((char *)p + SOAK_HEADER_BYTES);
  g_bitmap = (uint64_t *)((char *)p + soak_bitmap_offset(h.clients));
  g_seq_bits = h.seq_bits;
  g_clients = h.clients;
  __atomic_fetch_add(&g_hdr->opens, 1, __ATOMIC_SEQ_CST);
  return CHI_OK;
}

static chi_status_t record_handler(chi_request_t *req, void *user_data) {
  (void)user_data;
  uint64_t id;
  if (req->input_size < sizeof id || req->output_capacity < 2 * sizeof(uint64_t)) {
    __atomic_fetch_add(&g_hdr->bad_input, 1, __ATOMIC_RELAXED);
    return SOAK_ERR_BAD_INPUT;
  }
  memcpy(&id, req->input, sizeof id);
  size_t pad = soak_pad_len(id);
  const uint8_t *in = (const uint8_t *)req->input;
  int ok = req->input_size == sizeof id + pad;
  for (size_t i = 0; ok && i < pad; ++i) ok = in[8 + i] == soak_pad_byte(id, i);
  if (!ok) {
    __atomic_fetch_add(&g_hdr->bad_input, 1, __ATOMIC_RELAXED);
    return SOAK_ERR_BAD_INPUT;
  }
  uint64_t client = id >> 32, seq = id & 0xffffffffu;
  if (client >= g_clients || seq >= (1ull << g_seq_bits)) {
    __atomic_fetch_add(&g_hdr->out_of_range, 1, __ATOMIC_RELAXED);
    return SOAK_ERR_RANGE;
  }
  unsigned us = soak_sleep_us(id);
  if (us) usleep(us);
  uint64_t bit = (client << g_seq_bits) | seq;
  uint64_t mask = 1ull << (bit & 63);
  uint64_t old = __atomic_fetch_or(&g_bitmap[bit >> 6], mask, __ATOMIC_SEQ_CST);
  if (old & mask) {
    uint64_t n = __atomic_fetch_add(&g_hdr->duplicates, 1, __ATOMIC_SEQ_CST);
    if (n < SOAK_DUP_IDS) __atomic_store_n(&g_hdr->dup_ids[n], id, __ATOMIC_SEQ_CST);
  } else {
    __atomic_fetch_add(&g_hdr->records, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&g_per_client[client], 1, __ATOMIC_RELAXED);
    if (req->source >= 0) __atomic_fetch_add(&g_hdr->gpu_runs, 1, __ATOMIC_RELAXED);
  }
  uint64_t out[2] = {id, soak_fnv1a(req->input, req->input_size)};
  memcpy(req->output, out, sizeof out);
  req->output_size = sizeof out;
  return CHI_OK;
}

chi_status_t chimaera_module_init(chi_runtime_t *rt, uint32_t chi_version);

SOAK_EXPORT chi_status_t chimaera_module_init(chi_runtime_t *rt, uint32_t chi_version) {
  (void)chi_version;
  if (!g_hdr) {
    chi_status_t s = open_ledger();
    if (s != CHI_OK) return s;
  }
  chi_status_t s = chi_register_handler(rt, SOAK_METHOD, record_handler, NULL, NULL);
#ifdef SOAK_MODULE_GPU
  int32_t gpus = 0;
  if (s == CHI_OK && chi_gpu_count(rt, &gpus) == CHI_OK && gpus > 0) s = soak_module_install_gpu(rt);
#endif
  return s;
}
