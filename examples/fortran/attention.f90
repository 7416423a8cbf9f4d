! A causal forward and backward through kfa's Fortran module on the program's own arrays
! (head_dim, seqlen, heads, batch), checked against answers computed here: the last query,
! which sees every key, against a softmax in double, and the gradients against two identities
! of attention, per head and component: sum_j dV_j = sum_i dO_i and sum_j dK_j = 0.
! Stops with status 1 when a check fails (kfa itself stops the program on an error).
program attention
  use kfa
  use, intrinsic :: iso_c_binding, only: c_float, c_double
  implicit none
  integer, parameter :: d = 32, n = 64, h = 2, b = 1
  real(c_float) :: q(d, n, h, b), k(d, n, h, b), v(d, n, h, b), o(d, n, h, b), lse(n, h, b)
  real(c_float) :: dout(d, n, h, b), dq(d, n, h, b), dk(d, n, h, b), dv(d, n, h, b)
  real(c_double) :: w(n), err_o, err_dv, err_dk
  type(kfa_params) :: p
  integer :: i, j, e, hh

  do hh = 1, h
    do i = 1, n
      do e = 1, d
        q(e, i, hh, 1) = real(sin(0.1d0 * i + 0.7d0 * e + hh), c_float)
        k(e, i, hh, 1) = real(cos(0.3d0 * i - 0.2d0 * e + hh), c_float)
        v(e, i, hh, 1) = real(0.01d0 * i - 0.02d0 * e + hh, c_float)
        dout(e, i, hh, 1) = real(sin(0.05d0 * i * e + hh), c_float)
      end do
    end do
  end do

  call kfa_initialize()
  p = kfa_params_default()
  p%causal = 1
  call kfa_forward(q, k, v, o, lse, p)
  call kfa_backward(q, k, v, o, lse, dout, dq, dk, dv, p)
  call kfa_finalize()

  err_o = 0
  err_dv = 0
  err_dk = 0
  do hh = 1, h
    do j = 1, n
      w(j) = exp(dot_product(real(q(:, n, hh, 1), c_double), &
                             real(k(:, j, hh, 1), c_double)) / sqrt(real(d, c_double)))
    end do
    err_o = max(err_o, abs(lse(n, hh, 1) - log(sum(w))))
    do e = 1, d
      err_o = max(err_o, abs(o(e, n, hh, 1) - sum(w * v(e, :, hh, 1)) / sum(w)))
      err_dv = max(err_dv, abs(sum(real(dv(e, :, hh, 1), c_double)) - &
                               sum(real(dout(e, :, hh, 1), c_double))))
      err_dk = max(err_dk, abs(sum(real(dk(e, :, hh, 1), c_double))))
    end do
  end do
  print '(a, es9.2, a, es9.2, a, es9.2)', 'kfa from Fortran: last row error', err_o, &
    ', sum dV - sum dO', err_dv, ', sum dK', err_dk
  if (err_o > 1d-4 .or. err_dv > 1d-3 .or. err_dk > 1d-3) error stop 1
end program attention
