/* Shared by the soak module, client and checker (scripts/soak.sh).
 *
 * A task id is (client number << 32 | sequence).  Its input is the id
 * (8 bytes, little-endian) followed by 0..SOAK_MAX_PAD bytes of padding that
 * both sides derive from the id; its output is { id, FNV-1a of the input }.
 *
 * The ledger is a file (env CHI_SOAK_LEDGER) that the module maps shared, so
 * what it records survives a killed server: a header of counters, then one
 * bit per possible id, SOAK_SEQ_BITS of sequence per client number.  The
 * file is sparse: only the pages of ids that ran take space.
 *
 * Also compiled by nvcc (the module's GPU handler, soak_gpu.cu): the id,
 * padding and checksum helpers are SOAK_HD, callable on both sides. */
#ifndef CHI_SOAK_COMMON_H
#define CHI_SOAK_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define SOAK_HD __host__ __device__
#else
#define SOAK_HD
#endif

#define SOAK_METHOD "soak.record"

#define SOAK_MAGIC 0x314b414f53494843ull /* "CHISOAK1" */
#define SOAK_DEFAULT_SEQ_BITS 28         /* 268M tasks a client number */
#define SOAK_DEFAULT_CLIENTS 8192        /* client numbers 0 .. 8191 */
#define SOAK_MAX_PAD 240                 /* padding bytes after the id */
#define SOAK_DUP_IDS 496                 /* duplicate ids kept in the header */
#define SOAK_HEADER_BYTES 4096           /* fixed part, then per-client counters */

/* Handler statuses (<= CHI_ERR_USER_BASE) and the client's own pseudo
 * status for an output that does not match its input. */
#define SOAK_ERR_BAD_INPUT (-1001) /* padding or size not as derived from the id */
#define SOAK_ERR_RANGE (-1002)     /* client number or sequence outside the ledger */
#define SOAK_ERR_INNER (-1003)     /* GPU handler: its GPU->CPU record did not answer */
#define SOAK_ERR_MISMATCH (-1004)  /* GPU handler: the CPU's checksum differs from the GPU's */
#define SOAK_BAD_OUTPUT (-2001)    /* client: wrong output size, id or checksum */
#define SOAK_HANG (-2002)          /* soak_gpu: a device wait that did not end within its bound */

/* Log lines (soak_client.c, soak_gpu.cu): R/S for soak.record (in the
 * ledger), B for a built-in method's outcome (chi.echo/add/checksum: output
 * checked, never in the ledger), L for a soak.record future released
 * unwaited (outcome unknown by design). */

typedef struct soak_ledger_header {
  uint64_t magic;
  uint32_t seq_bits;
  uint32_t clients;
  uint64_t records;      /* handler runs that set a bit (first runs) */
  uint64_t duplicates;   /* handler runs of an id whose bit was already set */
  uint64_t bad_input;    /* inputs refused with SOAK_ERR_BAD_INPUT */
  uint64_t out_of_range; /* ids refused with SOAK_ERR_RANGE */
  uint64_t opens;        /* server starts that mapped this ledger */
  uint64_t gpu_runs;     /* of the first runs, those a GPU submitted (source >= 0) */
  uint64_t reserved[8];
  uint64_t dup_ids[SOAK_DUP_IDS]; /* the first duplicate ids, in order */
} soak_ledger_header_t;

#ifdef __cplusplus
static_assert(sizeof(soak_ledger_header_t) <= SOAK_HEADER_BYTES, "header fits");
#else
_Static_assert(sizeof(soak_ledger_header_t) <= SOAK_HEADER_BYTES, "header fits");
#endif

/* Per-client record counters follow the fixed header; the bitmap follows
 * them, page aligned. */
static inline size_t soak_bitmap_offset(uint32_t clients) {
  size_t end = SOAK_HEADER_BYTES + (size_t)clients * sizeof(uint64_t);
  return (end + 4095) & ~(size_t)4095;
}

static inline size_t soak_ledger_size(uint32_t seq_bits, uint32_t clients) {
  return soak_bitmap_offset(clients) + (((size_t)clients << seq_bits) >> 3);
}

static inline SOAK_HD uint64_t soak_mix(uint64_t x) { /* splitmix64 finalizer */
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Padding length of an id: 0, 16, ..., SOAK_MAX_PAD. */
static inline SOAK_HD size_t soak_pad_len(uint64_t id) {
  return (size_t)(soak_mix(id) % (SOAK_MAX_PAD / 16 + 1)) * 16;
}

static inline SOAK_HD uint8_t soak_pad_byte(uint64_t id, size_t i) {
  return (uint8_t)((soak_mix(id ^ 0x5a5a5a5aull) >> ((i & 7) * 8)) ^ (uint8_t)i);
}

/* Writes the input of task `id` to buf (at least 8 + SOAK_MAX_PAD bytes);
 * returns its size. */
static inline SOAK_HD size_t soak_make_input(uint64_t id, uint8_t *buf) {
  size_t pad = soak_pad_len(id);
  memcpy(buf, &id, sizeof id);
  for (size_t i = 0; i < pad; ++i) buf[8 + i] = soak_pad_byte(id, i);
  return 8 + pad;
}

static inline SOAK_HD uint64_t soak_fnv1a(const void *data, size_t n) {
  const uint8_t *p = (const uint8_t *)data;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

/* Whether the handler sleeps for this id, and how long (microseconds): one
 * task in 256 holds its worker a little, so that kills find tasks running. */
static inline SOAK_HD unsigned soak_sleep_us(uint64_t id) {
  uint64_t m = soak_mix(id ^ 0xa5a5ull);
  return (m & 255) == 0 ? (unsigned)(50 + (m >> 8) % 450) : 0;
}

#endif
