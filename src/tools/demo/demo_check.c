#include "demo_check.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

uint64_t chi_demo_fnv1a64(const void *data, size_t size) {
  const uint8_t *p = (const uint8_t *)data;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < size; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

/* splitmix64: a seedable generator whose streams do not depend on call order,
 * so task i is the same whichever thread or route builds it. */
static uint64_t mix(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static void put_le64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static void fill(uint64_t *state, uint8_t *dst, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = (uint8_t)mix(state);
}

void chi_demo_make_task(uint64_t seed, uint64_t index, chi_method_t reverse, int reverse_served,
                        chi_demo_task_t *task) {
  /* Sizes include the edges: empty, one byte, word boundaries, the maximum. */
  static const size_t sizes[] = {0, 1, 7, 8, 63, 64, 65, 100, 255, CHI_DEMO_MAX_INPUT};
  uint64_t state = seed ^ (index * 0xd1b54a32d192ed03ull);
  unsigned kinds = reverse ? 4u : 3u;
  size_t n = sizes[mix(&state) % (sizeof sizes / sizeof sizes[0])];

  memset(task, 0, sizeof *task);
  task->expect_status = CHI_OK;
  switch (index % kinds) {
    case 0:
      task->method = CHI_METHOD_ECHO;
      fill(&state, task->input, n);
      task->input_size = n;
      memcpy(task->expect, task->input, n);
      task->expect_size = n;
      break;
    case 1: {
      /* One pair in four wraps around 2^64 on purpose. */
      uint64_t a = mix(&state), b = mix(&state);
      if (mix(&state) % 4 == 0) b = UINT64_MAX - (a % 1000) + 3;
      put_le64(task->input, a);
      put_le64(task->input + 8, b);
      task->input_size = 16;
      task->method = CHI_METHOD_ADD;
      put_le64(task->expect, a + b);
      task->expect_size = 8;
      break;
    }
    case 2:
      task->method = CHI_METHOD_CHECKSUM;
      fill(&state, task->input, n);
      task->input_size = n;
      put_le64(task->expect, chi_demo_fnv1a64(task->input, n));
      task->expect_size = 8;
      break;
    default:
      task->method = reverse;
      fill(&state, task->input, n);
      task->input_size = n;
      if (reverse_served) {
        for (size_t i = 0; i < n; i++) task->expect[i] = task->input[n - 1 - i];
        task->expect_size = n;
      } else {
        task->expect_status = CHI_ERR_NOT_FOUND;
      }
      break;
  }
}

static const char *method_name(chi_method_t m) {
  switch (m) {
    case CHI_METHOD_ECHO: return "chi.echo";
    case CHI_METHOD_ADD: return "chi.add";
    case CHI_METHOD_CHECKSUM: return "chi.checksum";
    default: return CHI_DEMO_REVERSE_NAME;
  }
}

int chi_demo_check(const chi_demo_task_t *task, chi_status_t status, const void *output,
                   size_t output_size, char *why, size_t why_size) {
  if (status != task->expect_status) {
    if (why_size)
      snprintf(why, why_size, "%s (%zu bytes in): status %d (%s), expected %d (%s)",
               method_name(task->method), task->input_size, (int)status,
               chi_status_string(status), (int)task->expect_status,
               chi_status_string(task->expect_status));
    return 0;
  }
  if (status != CHI_OK) return 1;
  if (output_size != task->expect_size) {
    if (why_size)
      snprintf(why, why_size, "%s (%zu bytes in): %zu bytes out, expected %zu",
               method_name(task->method), task->input_size, output_size, task->expect_size);
    return 0;
  }
  if (output_size && memcmp(output, task->expect, output_size) != 0) {
    if (why_size) {
      if (task->expect_size == 8)
        snprintf(why, why_size, "%s (%zu bytes in): got 0x%016llx, expected 0x%016llx",
                 method_name(task->method), task->input_size,
                 (unsigned long long)get_le64((const uint8_t *)output),
                 (unsigned long long)get_le64(task->expect));
      else
        snprintf(why, why_size, "%s (%zu bytes in): output bytes differ from the expected ones",
                 method_name(task->method), task->input_size);
    }
    return 0;
  }
  return 1;
}

chi_status_t chi_demo_reverse_handler(chi_request_t *req, void *user_data) {
  if (req->output_capacity < req->input_size) return CHI_ERR_TOO_LARGE;
  const uint8_t *in = (const uint8_t *)req->input;
  uint8_t *out = (uint8_t *)req->output;
  for (size_t i = 0; i < req->input_size; i++) out[i] = in[req->input_size - 1 - i];
  req->output_size = req->input_size;
  if (user_data) atomic_fetch_add_explicit((_Atomic uint64_t *)user_data, 1, memory_order_relaxed);
  return CHI_OK;
}
