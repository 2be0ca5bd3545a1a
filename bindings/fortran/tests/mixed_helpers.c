/* C side of fortran_mixed: C handlers that Fortran submits to, and C code
 * (from several threads) that submits to Fortran handlers, all in one
 * runtime.  Each function returns 0 or a negative chi status, or a positive
 * count of wrong results, and prints what went wrong to stderr. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "chimaera.h"

/* c.triple: one int64 in, three times it out. */
static chi_status_t triple_handler(chi_request_t *req, void *user_data) {
  (void)user_data;
  int64_t x;
  if (req->input_size != sizeof x) return CHI_ERR_INVALID;
  memcpy(&x, req->input, sizeof x);
  x *= 3;
  memcpy(req->output, &x, sizeof x);
  req->output_size = sizeof x;
  return CHI_OK;
}

/* c.via_fortran: hands its input to the Fortran method f.axpy and returns
 * that task's output; user_data points to the runtime. */
static chi_status_t via_fortran_handler(chi_request_t *req, void *user_data) {
  chi_runtime_t *rt = *(chi_runtime_t **)user_data;
  chi_method_t axpy;
  chi_future_t f;
  chi_status_t s = chi_method_lookup(rt, "f.axpy", &axpy);
  if (s != CHI_OK) return s;
  s = chi_submit(rt, CHI_ROUTE_CPU, axpy, req->input, req->input_size, &f);
  if (s != CHI_OK) return s;
  return chi_wait(rt, f, -1, req->output, req->output_capacity, &req->output_size);
}

static chi_runtime_t *g_rt_for_via;

int mixed_register_c(chi_runtime_t *rt) {
  chi_method_t id;
  chi_status_t s = chi_register_handler(rt, "c.triple", triple_handler, NULL, &id);
  if (s != CHI_OK) {
    fprintf(stderr, "register c.triple: %s\n", chi_last_error_message());
    return s;
  }
  g_rt_for_via = rt;
  s = chi_register_handler(rt, "c.via_fortran", via_fortran_handler, &g_rt_for_via, &id);
  if (s != CHI_OK) fprintf(stderr, "register c.via_fortran: %s\n", chi_last_error_message());
  return s;
}

/* Submits one int64 to the method `name` and waits for one int64 back. */
int mixed_c_call_i64(chi_runtime_t *rt, const char *name, int64_t in, int64_t *out) {
  chi_method_t m;
  chi_future_t f;
  size_t n = 0;
  chi_status_t s = chi_method_lookup(rt, name, &m);
  if (s == CHI_OK) s = chi_submit(rt, CHI_ROUTE_CPU, m, &in, sizeof in, &f);
  if (s == CHI_OK) s = chi_wait(rt, f, -1, out, sizeof *out, &n);
  if (s != CHI_OK) {
    fprintf(stderr, "C call of %s: %s: %s\n", name, chi_status_string(s), chi_last_error_message());
    return s;
  }
  return n == sizeof *out ? 0 : 1;
}

struct drive_args {
  chi_runtime_t *rt;
  chi_method_t axpy;
  int thread;
  int tasks;
  int result; /* 0, a negative status, or a count of wrong outputs */
};

/* f.axpy computes y(i) = a * x(i) + 1 for input [a, x(1..k)]. */
static void *drive_thread(void *p) {
  struct drive_args *a = p;
  for (int t = 0; t < a->tasks && a->result <= 0; t++) {
    double in[9], out[8] = {0};
    size_t n = 0;
    chi_future_t f;
    int k = 1 + (t + a->thread) % 8;
    in[0] = (double)(a->thread + 1);
    for (int i = 1; i <= k; i++) in[i] = (double)(t * 10 + i);
    chi_status_t s = chi_submit(a->rt, CHI_ROUTE_CPU, a->axpy, in, (size_t)(k + 1) * sizeof(double), &f);
    if (s == CHI_OK) s = chi_wait(a->rt, f, -1, out, sizeof out, &n);
    if (s != CHI_OK) {
      fprintf(stderr, "thread %d task %d: %s: %s\n", a->thread, t, chi_status_string(s),
              chi_last_error_message());
      a->result = s;
      return NULL;
    }
    if (n != (size_t)k * sizeof(double)) a->result++;
    for (int i = 0; i < k; i++)
      if (out[i] != in[0] * in[i + 1] + 1.0) a->result++;
  }
  return NULL;
}

/* nthreads C threads each submit `tasks` tasks to the Fortran f.axpy. */
int mixed_c_drives_fortran(chi_runtime_t *rt, int nthreads, int tasks) {
  chi_method_t axpy;
  chi_status_t s = chi_method_lookup(rt, "f.axpy", &axpy);
  if (s != CHI_OK) {
    fprintf(stderr, "lookup f.axpy: %s\n", chi_last_error_message());
    return s;
  }
  struct drive_args args[16];
  pthread_t tid[16];
  if (nthreads > 16) nthreads = 16;
  for (int i = 0; i < nthreads; i++) {
    args[i] = (struct drive_args){rt, axpy, i, tasks, 0};
    pthread_create(&tid[i], NULL, drive_thread, &args[i]);
  }
  int result = 0;
  for (int i = 0; i < nthreads; i++) {
    pthread_join(tid[i], NULL);
    if (args[i].result < 0 && result >= 0) result = args[i].result;
    else if (args[i].result > 0 && result >= 0) result += args[i].result;
  }
  return result;
}

/* A runtime that C owns, for Fortran to attach to. */
int mixed_c_start(chi_runtime_t **rt) {
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.num_workers = 2;
  cfg.gpus = 0;
  return chi_init(&cfg, rt);
}

int mixed_c_stop(chi_runtime_t *rt) { return chi_finalize(rt); }
