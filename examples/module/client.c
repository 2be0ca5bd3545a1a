/* Uses the runtime of a running chimaera-server: no address, so this user's
 * default server; "example.scale" comes from the server's module. */
#include <chimaera.h>
#include <pthread.h>
#include <stdio.h>

enum { THREADS = 4, TASKS = 1000, N = 8 };
static chi_runtime_t *rt;
static chi_method_t scale;

static void *work(void *arg) {
  long id = (long)arg, wrong = 0;
  for (int t = 0; t < TASKS; t++) {
    float in[1 + N] = {2.0f}, out[N]; /* the factor, then the values */
    for (int i = 0; i < N; i++) in[1 + i] = (float)(id * TASKS + t + i);
    chi_future_t f;
    chi_status_t s = chi_submit(rt, CHI_ROUTE_CPU, scale, in, sizeof in, &f);
    if (s == CHI_OK) s = chi_wait(rt, f, -1, out, sizeof out, NULL);
    if (s != CHI_OK) { /* CHI_ERR_DISCONNECTED once the server is gone */
      fprintf(stderr, "task: %s\n", chi_status_string(s));
      return (void *)-1L;
    }
    for (int i = 0; i < N; i++) wrong += out[i] != 2.0f * in[1 + i];
  }
  return (void *)wrong;
}

int main(void) {
  chi_config_t cfg;
  chi_config_init(&cfg);
  cfg.mode = CHI_MODE_CLIENT;
  if (chi_init(&cfg, &rt) != CHI_OK || chi_method_lookup(rt, "example.scale", &scale) != CHI_OK) {
    fprintf(stderr, "%s\n", chi_last_error_message());
    return 1;
  }
  pthread_t threads[THREADS];
  for (long i = 0; i < THREADS; i++) pthread_create(&threads[i], NULL, work, (void *)i);
  long wrong = 0;
  for (int i = 0; i < THREADS; i++) {
    void *r;
    pthread_join(threads[i], &r);
    wrong = (long)r < 0 || wrong < 0 ? -1 : wrong + (long)r;
  }
  printf("%d tasks: %s\n", THREADS * TASKS, wrong == 0 ? "all right" : "FAILED");
  chi_finalize(rt);
  return wrong != 0;
}
