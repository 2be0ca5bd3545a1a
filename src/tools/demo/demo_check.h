/* What chimaera-demo expects of each method, shared with the GPU hook so that
 * a result computed on a GPU is checked by the same code. */
#ifndef CHI_DEMO_CHECK_H
#define CHI_DEMO_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "chimaera.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The demo's own CPU method: output = input bytes in reverse order. */
#define CHI_DEMO_REVERSE_NAME "demo.reverse"

/* Largest input the demo sends (well under the default inline limit). */
#define CHI_DEMO_MAX_INPUT 256

/* One generated task: method, input bytes, and the answer expected back. */
typedef struct chi_demo_task {
  chi_method_t method;
  uint8_t input[CHI_DEMO_MAX_INPUT];
  size_t input_size;
  uint8_t expect[CHI_DEMO_MAX_INPUT];
  size_t expect_size;
  chi_status_t expect_status; /* CHI_OK, or the status chi_wait must return */
} chi_demo_task_t;

/* 64-bit FNV-1a, as chi.checksum defines it. */
uint64_t chi_demo_fnv1a64(const void *data, size_t size);

/* Builds task number `index` of a run: the methods rotate through chi.echo,
 * chi.add, chi.checksum and, when reverse != 0, demo.reverse; inputs come from
 * a PRNG seeded with `seed` and `index` (sizes 0..CHI_DEMO_MAX_INPUT, add
 * operands that wrap around).  When reverse_served is 0 the reverse task
 * expects CHI_ERR_NOT_FOUND (an executor without a handler for it). */
void chi_demo_make_task(uint64_t seed, uint64_t index, chi_method_t reverse, int reverse_served,
                        chi_demo_task_t *task);

/* Compares a result with what *task expects.  Returns 1 when it matches, else
 * 0 and writes a one-line reason to why (why_size bytes, may be 0). */
int chi_demo_check(const chi_demo_task_t *task, chi_status_t status, const void *output,
                   size_t output_size, char *why, size_t why_size);

/* The demo.reverse handler (user_data: an _Atomic uint64_t call counter, or NULL). */
chi_status_t chi_demo_reverse_handler(chi_request_t *req, void *user_data);

#ifdef __cplusplus
}
#endif

#endif /* CHI_DEMO_CHECK_H */
