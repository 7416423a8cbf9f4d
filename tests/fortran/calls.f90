! Calls of the Fortran module kfa, made from Fortran on the arrays a C++ suite (test_fortran.cpp)
! passes in, so that the suite compares them bitwise with the C++ API on the same memory.
module kfa_test_calls
  use, intrinsic :: iso_c_binding, only: c_int, c_int8_t, c_int32_t, c_int64_t, c_float, &
                                         c_double, c_char, c_null_char
  use kfa
  implicit none
contains

  subroutine forward_f32(d, e, nq, hq, nk, hk, b, q, k, v, o, lse, causal, status) &
      bind(c, name='fortran_forward_f32')
    integer(c_int), value :: d, e, nq, hq, nk, hk, b, causal  ! e: v's head dim
    real(c_float), intent(in) :: q(d, nq, hq, b), k(d, nk, hk, b), v(e, nk, hk, b)
    real(c_float), intent(inout) :: o(e, nq, hq, b), lse(nq, hq, b)
    integer(c_int), intent(out) :: status
    type(kfa_params) :: p
    integer :: s
    p = kfa_params_default()
    p%causal = causal
    call kfa_forward(q, k, v, o, lse, p, s)
    status = s
  end subroutine forward_f32

  subroutine forward_f64(d, e, nq, hq, nk, hk, b, q, k, v, o, lse, causal, status) &
      bind(c, name='fortran_forward_f64')
    integer(c_int), value :: d, e, nq, hq, nk, hk, b, causal  ! e: v's head dim
    real(c_double), intent(in) :: q(d, nq, hq, b), k(d, nk, hk, b), v(e, nk, hk, b)
    real(c_double), intent(inout) :: o(e, nq, hq, b), lse(nq, hq, b)
    integer(c_int), intent(out) :: status
    type(kfa_params) :: p
    integer :: s
    p = kfa_params_default()
    p%causal = causal
    call kfa_forward(q, k, v, o, lse, p, s)
    status = s
  end subroutine forward_f64

  subroutine backward_f32(d, e, nq, hq, nk, hk, b, q, k, v, o, lse, dout, dlse, dq, dk, &
                             dv, causal, with_dlse, status) bind(c, name='fortran_backward_f32')
    integer(c_int), value :: d, e, nq, hq, nk, hk, b, causal, with_dlse  ! e: v's head dim
    real(c_float), intent(in) :: q(d, nq, hq, b), k(d, nk, hk, b), v(e, nk, hk, b), &
                               o(e, nq, hq, b), lse(nq, hq, b), dout(e, nq, hq, b), &
                               dlse(nq, hq, b)
    real(c_float), intent(inout) :: dq(d, nq, hq, b), dk(d, nk, hk, b), dv(e, nk, hk, b)
    integer(c_int), intent(out) :: status
    type(kfa_params) :: p
    integer :: s
    p = kfa_params_default()
    p%causal = causal
    if (with_dlse /= 0) then
      call kfa_backward(q, k, v, o, lse, dout, dq, dk, dv, p, dlse=dlse, status=s)
    else
      call kfa_backward(q, k, v, o, lse, dout, dq, dk, dv, p, status=s)
    end if
    status = s
  end subroutine backward_f32

  subroutine backward_f64(d, e, nq, hq, nk, hk, b, q, k, v, o, lse, dout, dlse, dq, dk, &
                             dv, causal, with_dlse, status) bind(c, name='fortran_backward_f64')
    integer(c_int), value :: d, e, nq, hq, nk, hk, b, causal, with_dlse  ! e: v's head dim
    real(c_double), intent(in) :: q(d, nq, hq, b), k(d, nk, hk, b), v(e, nk, hk, b), &
                               o(e, nq, hq, b), lse(nq, hq, b), dout(e, nq, hq, b), &
                               dlse(nq, hq, b)
    real(c_double), intent(inout) :: dq(d, nq, hq, b), dk(d, nk, hk, b), dv(e, nk, hk, b)
    integer(c_int), intent(out) :: status
    type(kfa_params) :: p
    integer :: s
    p = kfa_params_default()
    p%causal = causal
    if (with_dlse /= 0) then
      call kfa_backward(q, k, v, o, lse, dout, dq, dk, dv, p, dlse=dlse, status=s)
    else
      call kfa_backward(q, k, v, o, lse, dout, dq, dk, dv, p, status=s)
    end if
    status = s
  end subroutine backward_f64

  subroutine mpi_forward_f64(d, nq, hq, nk, hk, b, q, k, v, o, lse, comm, seqlen_q, seqlen_k, &
                             layout, mode, causal, status) bind(c, name='fortran_mpi_forward_f64')
    integer(c_int), value :: d, nq, hq, nk, hk, b, comm, seqlen_q, seqlen_k, layout, mode, causal
    real(c_double), intent(in) :: q(d, nq, hq, b), k(d, nk, hk, b), v(d, nk, hk, b)
    real(c_double), intent(inout) :: o(d, nq, hq, b), lse(nq, hq, b)
    integer(c_int), intent(out) :: status
    type(kfa_params) :: p
    integer :: s
    p = kfa_params_default()
    p%causal = causal
    call kfa_mpi_forward(q, k, v, o, lse, comm, seqlen_q, seqlen_k, p, layout, mode, s)
    status = s
  end subroutine mpi_forward_f64

  subroutine mpi_backward_f32(d, nq, hq, nk, hk, b, q, k, v, o, lse, dout, dlse, dq, dk, dv, &
                              comm, seqlen_q, seqlen_k, layout, mode, causal, status) &
      bind(c, name='fortran_mpi_backward_f32')
    integer(c_int), value :: d, nq, hq, nk, hk, b, comm, seqlen_q, seqlen_k, layout, mode, causal
    real(c_float), intent(in) :: q(d, nq, hq, b), k(d, nk, hk, b), v(d, nk, hk, b), &
                                 o(d, nq, hq, b), lse(nq, hq, b), dout(d, nq, hq, b), &
                                 dlse(nq, hq, b)
    real(c_float), intent(inout) :: dq(d, nq, hq, b), dk(d, nk, hk, b), dv(d, nk, hk, b)
    integer(c_int), intent(out) :: status
    type(kfa_params) :: p
    integer :: s
    p = kfa_params_default()
    p%causal = causal
    call kfa_mpi_backward(q, k, v, o, lse, dout, dq, dk, dv, comm, seqlen_q, seqlen_k, p, &
                          layout, mode, dlse=dlse, status=s)
    status = s
  end subroutine mpi_backward_f32

  ! kfa_forward and kfa_backward with a bias and its gradient (causal, double).
  subroutine bias_f64(d, nq, hq, nk, hk, b, q, k, v, o, lse, dout, dq, dk, dv, bias, dbias, &
                      status) bind(c, name='fortran_bias_f64')
    integer(c_int), value :: d, nq, hq, nk, hk, b
    real(c_double), intent(in) :: q(d, nq, hq, b), k(d, nk, hk, b), v(d, nk, hk, b), &
                                  dout(d, nq, hq, b), bias(nk, nq, hq, b)
    real(c_double), intent(inout) :: o(d, nq, hq, b), lse(nq, hq, b), dq(d, nq, hq, b), &
                                     dk(d, nk, hk, b), dv(d, nk, hk, b), dbias(nk, nq, hq, b)
    integer(c_int), intent(out) :: status
    type(kfa_params) :: p
    integer :: s
    p = kfa_params_default()
    p%causal = 1
    call kfa_forward(q, k, v, o, lse, p, s, bias=bias)
    status = s
    if (s /= KFA_OK) return
    call kfa_backward(q, k, v, o, lse, dout, dq, dk, dv, p, status=s, bias=bias, dbias=dbias)
    status = s
  end subroutine bias_f64

  ! kfa_forward (float) with one term: which = 0 the mask, 1 the key lengths, 2 the mask as the
  ! odd rows of an array twice as tall (a section that is not contiguous, which the compiler
  ! copies for the module's CONTIGUOUS argument).
  subroutine term_f32(d, nq, hq, nk, hk, b, q, k, v, o, lse, mask, key_lengths, which, status) &
      bind(c, name='fortran_term_f32')
    integer(c_int), value :: d, nq, hq, nk, hk, b, which
    real(c_float), intent(in) :: q(d, nq, hq, b), k(d, nk, hk, b), v(d, nk, hk, b)
    integer(c_int8_t), intent(in) :: mask(nk, nq, hq, b)
    integer(c_int32_t), intent(in) :: key_lengths(b)
    real(c_float), intent(inout) :: o(d, nq, hq, b), lse(nq, hq, b)
    integer(c_int), intent(out) :: status
    integer(c_int8_t), allocatable :: tall(:, :, :, :)
    integer :: s
    select case (which)
    case (0)
      call kfa_forward(q, k, v, o, lse, status=s, mask=mask)
    case (1)
      call kfa_forward(q, k, v, o, lse, status=s, key_lengths=key_lengths)
    case default
      allocate (tall(2 * nk, nq, hq, b))
      tall(1::2, :, :, :) = mask
      call kfa_forward(q, k, v, o, lse, status=s, mask=tall(1::2, :, :, :))
    end select
    status = s
  end subroutine term_f32

  ! kfa_varlen_forward and kfa_varlen_backward (causal, float) on packed arrays
  ! (head_dim, heads, total) with nb + 1 offsets.
  subroutine varlen_f32(d, hq, hk, nb, tq, tk, q, k, v, cu_q, cu_k, o, lse, dout, dq, dk, dv, &
                        status) bind(c, name='fortran_varlen_f32')
    integer(c_int), value :: d, hq, hk, nb, tq, tk
    real(c_float), intent(in) :: q(d, hq, tq), k(d, hk, tk), v(d, hk, tk), dout(d, hq, tq)
    integer(c_int32_t), intent(in) :: cu_q(nb + 1), cu_k(nb + 1)
    real(c_float), intent(inout) :: o(d, hq, tq), lse(tq, hq), dq(d, hq, tq), dk(d, hk, tk), &
                                    dv(d, hk, tk)
    integer(c_int), intent(out) :: status
    type(kfa_params) :: p
    integer :: s
    p = kfa_params_default()
    p%causal = 1
    call kfa_varlen_forward(q, k, v, cu_q, cu_k, o, lse, p, s)
    status = s
    if (s /= KFA_OK) return
    call kfa_varlen_backward(q, k, v, o, lse, dout, cu_q, cu_k, dq, dk, dv, p, status=s)
    status = s
  end subroutine varlen_f32

  ! kfa_release_workspaces through the module, then kfa_workspace_bytes: the bytes left.
  subroutine release_workspaces(bytes, status) bind(c, name='fortran_release_workspaces')
    integer(c_int64_t), intent(out) :: bytes
    integer(c_int), intent(out) :: status
    integer :: s
    call kfa_release_workspaces(status=s)
    status = s
    bytes = kfa_workspace_bytes()
  end subroutine release_workspaces

  ! kfa_last_error() through the module, copied into buf (at most n - 1 characters).
  subroutine last_error(buf, n) bind(c, name='fortran_last_error')
    integer(c_int), value :: n
    character(kind=c_char), intent(out) :: buf(n)
    character(:), allocatable :: msg
    integer :: i
    msg = kfa_last_error()
    do i = 1, min(len(msg), n - 1)
      buf(i) = msg(i:i)
    end do
    buf(min(len(msg), n - 1) + 1) = c_null_char
  end subroutine last_error
end module kfa_test_calls
