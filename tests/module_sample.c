/* A chimaera module for test_modules, built three ways from this file:
 *   plain                 chimaera_module_init registers sample.double and
 *                         sample.version;
 *   SAMPLE_NO_INIT        exports no chimaera_module_init at all;
 *   SAMPLE_INIT_FAILS     chimaera_module_init returns SAMPLE_INIT_STATUS. */
#include <string.h>

#include "chimaera.h"

#define SAMPLE_EXPORT __attribute__((visibility("default")))
#define SAMPLE_INIT_STATUS (-1777)

#if defined(SAMPLE_NO_INIT)

SAMPLE_EXPORT int chimaera_module_something_else(void) { return 0; }

#else

chi_status_t chimaera_module_init(chi_runtime_t *rt, uint32_t chi_version);

#if defined(SAMPLE_INIT_FAILS)

SAMPLE_EXPORT chi_status_t chimaera_module_init(chi_runtime_t *rt, uint32_t chi_version) {
  (void)rt;
  (void)chi_version;
  return SAMPLE_INIT_STATUS;
}

#else

/* sample.double: uint64 in, twice it out. */
static chi_status_t double_handler(chi_request_t *req, void *user_data) {
  (void)user_data;
  uint64_t v;
  if (req->input_size != sizeof v || req->output_capacity < sizeof v) return CHI_ERR_INVALID;
  memcpy(&v, req->input, sizeof v);
  v *= 2;
  memcpy(req->output, &v, sizeof v);
  req->output_size = sizeof v;
  return CHI_OK;
}

/* sample.version: the chi_version this module's init was given (uint32). */
static chi_status_t version_handler(chi_request_t *req, void *user_data) {
  uint32_t v = (uint32_t)(uintptr_t)user_data;
  if (req->output_capacity < sizeof v) return CHI_ERR_INVALID;
  memcpy(req->output, &v, sizeof v);
  req->output_size = sizeof v;
  return CHI_OK;
}

SAMPLE_EXPORT chi_status_t chimaera_module_init(chi_runtime_t *rt, uint32_t chi_version) {
  chi_status_t s = chi_register_handler(rt, "sample.double", double_handler, NULL, NULL);
  if (s != CHI_OK) return s;
  return chi_register_handler(rt, "sample.version", version_handler,
                              (void *)(uintptr_t)chi_version, NULL);
}

#endif
#endif
