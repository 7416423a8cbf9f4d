/* The C interface from C (the header compiles as C99): before kfa_initialize a pass fails with
 * KFA_ERROR_NOT_INITIALIZED; kfa_initialize starts Kokkos, a pass then runs (one query and one
 * key: o = v and lse = scale * q.k exactly); kfa_finalize stops it, and kfa_initialize cannot
 * start it again. */
#include <kfa/kfa.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;

static void expect(int ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "FAILED: %s (kfa_last_error: \"%s\")\n", what, kfa_last_error());
    ++failures;
  }
}

int main(void) {
  double q[4] = {0.5, -1, 2, 0.25}, k[4] = {1, 0.5, -0.5, 2}, v[4] = {3, -2, 0.125, 7};
  double o[4] = {0}, lse[1] = {0};
  const kfa_tensor tq = kfa_tensor_contiguous(q, 1, 1, 1, 4);
  const kfa_tensor tk = kfa_tensor_contiguous(k, 1, 1, 1, 4);
  const kfa_tensor tv = kfa_tensor_contiguous(v, 1, 1, 1, 4);
  const kfa_tensor to = kfa_tensor_contiguous(o, 1, 1, 1, 4);
  const kfa_tensor tl = kfa_tensor_contiguous(lse, 1, 1, 1, 0);
  kfa_params p = kfa_params_default();
  p.scale = 0.5;

  expect(kfa_forward_f64(&tq, &tk, &tv, &to, &tl, &p, KFA_MEMORY_HOST) ==
             KFA_ERROR_NOT_INITIALIZED,
         "a pass before kfa_initialize returns KFA_ERROR_NOT_INITIALIZED");
  expect(strstr(kfa_last_error(), "kfa_initialize") != NULL, "the message names kfa_initialize");
  expect(o[0] == 0 && lse[0] == 0, "nothing written on error");

  expect(kfa_initialize() == KFA_OK, "kfa_initialize");
  expect(kfa_initialize() == KFA_OK, "kfa_initialize twice");
  expect(kfa_forward_f64(&tq, &tk, &tv, &to, &tl, &p, KFA_MEMORY_HOST) == KFA_OK, "forward");
  expect(memcmp(o, v, sizeof o) == 0, "one key: o = v");
  /* q.k = 0.5 - 0.5 - 1 + 0.5 = -0.5, times scale 0.5. */
  expect(lse[0] == -0.25, "one key: lse = scale * q.k");
  expect(strcmp(kfa_last_error(), "") == 0, "no message after a success");
  expect(kfa_finalize() == KFA_OK, "kfa_finalize");
  expect(kfa_initialize() == KFA_ERROR_UNSUPPORTED, "no second start after kfa_finalize");
  expect(strstr(kfa_last_error(), "kfa_finalize") != NULL, "the message says why");
  if (failures == 0) printf("test_c_lifecycle: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
