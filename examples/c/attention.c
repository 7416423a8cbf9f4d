/* A causal forward and backward through kfa's C interface on the program's own arrays, checked
 * against answers computed here: the last query (which sees every key) against a softmax in
 * double, and the gradients against two identities of attention, per head and component:
 * sum_j dV_j = sum_i dO_i (each row of P sums to 1) and sum_j dK_j = 0 (each row of dS sums
 * to 0). Exits 1 when a check fails, 2 when kfa reports an error. */
#include <kfa/kfa.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { B = 1, H = 2, N = 64, D = 32 };
static float q[B][H][N][D], k[B][H][N][D], v[B][H][N][D], o[B][H][N][D], lse[B][H][N];
static float dout[B][H][N][D], dq[B][H][N][D], dk[B][H][N][D], dv[B][H][N][D];

static int check(kfa_status s) {
  if (s != KFA_OK) {
    fprintf(stderr, "%s\n", kfa_last_error());
    exit(2);
  }
  return 0;
}

int main(void) {
  for (int h = 0; h < H; ++h)
    for (int i = 0; i < N; ++i)
      for (int d = 0; d < D; ++d) {
        q[0][h][i][d] = (float)sin(0.1 * i + 0.7 * d + h);
        k[0][h][i][d] = (float)cos(0.3 * i - 0.2 * d + h);
        v[0][h][i][d] = (float)(0.01 * i - 0.02 * d + h);
        dout[0][h][i][d] = (float)sin(0.05 * i * d + h);
      }
  check(kfa_initialize());
  const kfa_tensor tq = kfa_tensor_contiguous(q, B, H, N, D),
                   tk = kfa_tensor_contiguous(k, B, H, N, D),
                   tv = kfa_tensor_contiguous(v, B, H, N, D),
                   to = kfa_tensor_contiguous(o, B, H, N, D),
                   tlse = kfa_tensor_contiguous(lse, B, H, N, 0),
                   tdout = kfa_tensor_contiguous(dout, B, H, N, D),
                   tdq = kfa_tensor_contiguous(dq, B, H, N, D),
                   tdk = kfa_tensor_contiguous(dk, B, H, N, D),
                   tdv = kfa_tensor_contiguous(dv, B, H, N, D);
  kfa_params p = kfa_params_default();
  p.causal = 1;
  check(kfa_forward_f32(&tq, &tk, &tv, &to, &tlse, &p, KFA_MEMORY_HOST));
  check(kfa_backward_f32(&tq, &tk, &tv, &to, &tlse, &tdout, NULL, &tdq, &tdk, &tdv, &p,
                         KFA_MEMORY_HOST));

  double err_o = 0, err_dv = 0, err_dk = 0;
  for (int h = 0; h < H; ++h) {
    double w[N], sum = 0;
    for (int j = 0; j < N; ++j) {
      double s = 0;
      for (int d = 0; d < D; ++d) s += (double)q[0][h][N - 1][d] * k[0][h][j][d];
      w[j] = exp(s / sqrt((double)D));
      sum += w[j];
    }
    err_o = fmax(err_o, fabs(lse[0][h][N - 1] - log(sum)));
    for (int d = 0; d < D; ++d) {
      double ref = 0, sum_dv = 0, sum_dout = 0, sum_dk = 0;
      for (int j = 0; j < N; ++j) {
        ref += w[j] / sum * v[0][h][j][d];
        sum_dv += dv[0][h][j][d];
        sum_dout += dout[0][h][j][d];
        sum_dk += dk[0][h][j][d];
      }
      err_o = fmax(err_o, fabs(o[0][h][N - 1][d] - ref));
      err_dv = fmax(err_dv, fabs(sum_dv - sum_dout));
      err_dk = fmax(err_dk, fabs(sum_dk));
    }
  }
  check(kfa_finalize());
  printf("kfa from C: last row error %.2g, sum dV - sum dO %.2g, sum dK %.2g\n", err_o, err_dv,
         err_dk);
  return err_o < 1e-4 && err_dv < 1e-3 && err_dk < 1e-3 ? 0 : 1;
}
