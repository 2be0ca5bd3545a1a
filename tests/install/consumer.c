/* A program built against an installed chimaera, through pkg-config or
 * find_package(chimaera).  Prints "OK <path of the library it runs with>". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include <chimaera.h>

static chi_status_t square(chi_request_t *req, void *user_data) {
  (void)user_data;
  unsigned long long v;
  if (req->input_size != sizeof v || req->output_capacity < sizeof v) return CHI_ERR_INVALID;
  memcpy(&v, req->input, sizeof v);
  v *= v;
  memcpy(req->output, &v, sizeof v);
  req->output_size = sizeof v;
  return CHI_OK;
}

static int check(chi_status_t s, const char *what) {
  if (s == CHI_OK) return 0;
  fprintf(stderr, "consumer: %s: %s (%s)\n", what, chi_status_string(s), chi_last_error_message());
  return 1;
}

int main(void) {
  if (chi_version() != CHI_VERSION_NUMBER) {
    fprintf(stderr, "consumer: header %d, library %u\n", CHI_VERSION_NUMBER, chi_version());
    return 1;
  }
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.gpus = 0;
  cfg.num_workers = 1;
  chi_runtime_t *rt = NULL;
  if (check(chi_init(&cfg, &rt), "chi_init")) return 1;
  chi_method_t m = 0;
  chi_future_t f = 0;
  unsigned long long in = 12, out = 0;
  size_t out_size = 0;
  if (check(chi_register_handler(rt, "consumer.square", square, NULL, &m), "register") ||
      check(chi_submit(rt, CHI_ROUTE_CPU, m, &in, sizeof in, &f), "submit") ||
      check(chi_wait(rt, f, -1, &out, sizeof out, &out_size), "wait"))
    return 1;
  if (out_size != sizeof out || out != 144) {
    fprintf(stderr, "consumer: 12 squared gave %llu\n", out);
    return 1;
  }
  if (check(chi_finalize(rt), "finalize")) return 1;

  Dl_info info;
  if (!dladdr((void *)chi_version, &info) || !info.dli_fname) {
    fprintf(stderr, "consumer: dladdr failed\n");
    return 1;
  }
  printf("OK %s\n", info.dli_fname);
  return 0;
}
