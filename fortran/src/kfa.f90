!> kfa's Fortran 2008 interface: exact attention (kfa::forward and kfa::backward) on the
!> caller's arrays, through the C interface <kfa/kfa.h> with iso_c_binding.
!>
!> Arrays are contiguous, in Fortran order (head_dim, seqlen, heads, batch), the same memory as
!> C's row-major (batch, heads, seqlen, head_dim); lse is (seqlen, heads, batch). The procedures
!> are generic over real(c_float) and real(c_double). status (optional) receives a KFA_* code;
!> without it a failure stops the program with kfa_last_error()'s message. On failure nothing
!> is written to any output.
module kfa
  use, intrinsic :: iso_c_binding, only: c_int, c_int8_t, c_int32_t, c_int64_t, c_double, &
                                         c_float, c_ptr, c_char, c_size_t, c_loc, c_f_pointer, &
                                         c_null_ptr, c_associated
  use, intrinsic :: iso_fortran_env, only: error_unit
  implicit none
  private

  public :: kfa_params, kfa_params_default, kfa_initialize, kfa_finalize, kfa_last_error, &
            kfa_release_workspaces, kfa_workspace_bytes, kfa_forward, kfa_backward, &
            kfa_mpi_forward, kfa_mpi_backward, kfa_varlen_forward, kfa_varlen_backward

  !> Status codes (kfa_status in kfa.h).
  integer(c_int), parameter, public :: KFA_OK = 0, KFA_ERROR_INVALID_ARGUMENT = 1, &
                                       KFA_ERROR_NULL_POINTER = 2, KFA_ERROR_NOT_INITIALIZED = 3, &
                                       KFA_ERROR_UNSUPPORTED = 4, KFA_ERROR_OUT_OF_MEMORY = 5, &
                                       KFA_ERROR_INTERNAL = 6
  !> Mask alignments (kfa_align), for params%align.
  integer(c_int), parameter, public :: KFA_ALIGN_BOTTOM_RIGHT = 0, KFA_ALIGN_TOP_LEFT = 1
  integer(c_int), parameter, public :: KFA_DQ_AUTO = 0, KFA_DQ_ATOMIC = 1, KFA_DQ_QUERY_PASS = 2, &
                                       KFA_DQ_SYMMETRIC = 3

  !> kfa::mpi's sequence layouts and modes (kfa_mpi_layout, kfa_mpi_mode).
  integer(c_int), parameter, public :: KFA_MPI_LAYOUT_CONTIGUOUS = 0, KFA_MPI_LAYOUT_ZIGZAG = 1, &
                                       KFA_MPI_MODE_RING = 0, KFA_MPI_MODE_TREE = 1

  integer(c_int), parameter :: memory_host = 0
  ! kfa_term_kind and kfa_index_type in kfa.h.
  integer(c_int), parameter :: term_none = 0, term_mask = 1, term_key_padding = 2, term_bias = 3, &
                               term_alibi = 4, int32_lengths = 0

  !> The options of a pass (kfa_params in kfa.h, field for field); start from
  !> kfa_params_default(). causal and deterministic are 0 or 1.
  type, bind(c) :: kfa_params
    real(c_double) :: scale
    integer(c_int) :: causal, align, window_left, window_right
    real(c_double) :: softcap, dropout
    integer(c_int64_t) :: seed, offset
    integer(c_int) :: deterministic, num_splits, dq_mode
  end type kfa_params

  ! kfa_tensor in kfa.h: extents and strides in C's order; strides 0 = contiguous.
  type, bind(c) :: tensor_t
    type(c_ptr) :: data = c_null_ptr
    integer(c_int64_t) :: extent(4) = 0, stride(4) = 0
  end type tensor_t

  ! kfa_term in kfa.h: the one score term of a call (kind term_none: none).
  type, bind(c) :: term_t
    integer(c_int) :: kind = term_none
    type(tensor_t) :: values, dbias
    integer(c_int) :: lengths_type = int32_lengths
  end type term_t

  ! kfa_seqpar in kfa.h.
  type, bind(c) :: seqpar_t
    integer(c_int64_t) :: seqlen_q, seqlen_k
    integer(c_int) :: comm, layout, mode
  end type seqpar_t

  interface
    !> The defaults of kfa::Params.
    function kfa_params_default() bind(c, name='kfa_params_default') result(p)
      import :: kfa_params
      type(kfa_params) :: p
    end function kfa_params_default

    function c_initialize() bind(c, name='kfa_initialize') result(s)
      import :: c_int
      integer(c_int) :: s
    end function c_initialize

    function c_finalize() bind(c, name='kfa_finalize') result(s)
      import :: c_int
      integer(c_int) :: s
    end function c_finalize

    function c_last_error() bind(c, name='kfa_last_error') result(p)
      import :: c_ptr
      type(c_ptr) :: p
    end function c_last_error

    function c_release_workspaces() bind(c, name='kfa_release_workspaces') result(s)
      import :: c_int
      integer(c_int) :: s
    end function c_release_workspaces

    function c_workspace_bytes() bind(c, name='kfa_workspace_bytes') result(n)
      import :: c_int64_t
      integer(c_int64_t) :: n
    end function c_workspace_bytes

    function c_strlen(s) bind(c, name='strlen') result(n)
      import :: c_ptr, c_size_t
      type(c_ptr), value :: s
      integer(c_size_t) :: n
    end function c_strlen

    function c_forward_term_f32(q, k, v, o, lse, params, term, memory) &
        bind(c, name='kfa_forward_term_f32') result(s)
      import :: c_int, tensor_t, kfa_params, term_t
      type(tensor_t), intent(in) :: q, k, v, o, lse
      type(kfa_params), intent(in) :: params
      type(term_t), intent(in) :: term
      integer(c_int), value :: memory
      integer(c_int) :: s
    end function c_forward_term_f32

    function c_backward_term_f32(q, k, v, o, lse, dout, dlse, dq, dk, dv, params, term, memory) &
        bind(c, name='kfa_backward_term_f32') result(s)
      import :: c_int, c_ptr, tensor_t, kfa_params, term_t
      type(tensor_t), intent(in) :: q, k, v, o, lse, dout, dq, dk, dv
      type(c_ptr), value :: dlse
      type(kfa_params), intent(in) :: params
      type(term_t), intent(in) :: term
      integer(c_int), value :: memory
      integer(c_int) :: s
    end function c_backward_term_f32

    function c_mpi_forward_term_f32(q, k, v, o, lse, params, term, seqpar, memory) &
        bind(c, name='kfa_mpi_forward_term_f32') result(s)
      import :: c_int, tensor_t, kfa_params, term_t, seqpar_t
      type(tensor_t), intent(in) :: q, k, v, o, lse
      type(kfa_params), intent(in) :: params
      type(term_t), intent(in) :: term
      type(seqpar_t), intent(in) :: seqpar
      integer(c_int), value :: memory
      integer(c_int) :: s
    end function c_mpi_forward_term_f32

    function c_mpi_backward_term_f32(q, k, v, o, lse, dout, dlse, dq, dk, dv, params, term, &
                                      seqpar, memory) bind(c, name='kfa_mpi_backward_term_f32') &
        result(s)
      import :: c_int, c_ptr, tensor_t, kfa_params, term_t, seqpar_t
      type(tensor_t), intent(in) :: q, k, v, o, lse, dout, dq, dk, dv
      type(c_ptr), value :: dlse
      type(kfa_params), intent(in) :: params
      type(term_t), intent(in) :: term
      type(seqpar_t), intent(in) :: seqpar
      integer(c_int), value :: memory
      integer(c_int) :: s
    end function c_mpi_backward_term_f32

    function c_varlen_forward_f32(q, k, v, cu_q, cu_k, o, lse, params, memory) &
        bind(c, name='kfa_varlen_forward_f32') result(s)
      import :: c_int, tensor_t, kfa_params
      type(tensor_t), intent(in) :: q, k, v, cu_q, cu_k, o, lse
      type(kfa_params), intent(in) :: params
      integer(c_int), value :: memory
      integer(c_int) :: s
    end function c_varlen_forward_f32

    function c_varlen_backward_f32(q, k, v, o, lse, dout, dlse, cu_q, cu_k, dq, dk, dv, params, &
                                    memory) bind(c, name='kfa_varlen_backward_f32') result(s)
      import :: c_int, c_ptr, tensor_t, kfa_params
      type(tensor_t), intent(in) :: q, k, v, o, lse, dout, cu_q, cu_k, dq, dk, dv
      type(c_ptr), value :: dlse
      type(kfa_params), intent(in) :: params
      integer(c_int), value :: memory
      integer(c_int) :: s
    end function c_varlen_backward_f32

    function c_forward_term_f64(q, k, v, o, lse, params, term, memory) &
        bind(c, name='kfa_forward_term_f64') result(s)
      import :: c_int, tensor_t, kfa_params, term_t
      type(tensor_t), intent(in) :: q, k, v, o, lse
      type(kfa_params), intent(in) :: params
      type(term_t), intent(in) :: term
      integer(c_int), value :: memory
      integer(c_int) :: s
    end function c_forward_term_f64

    function c_backward_term_f64(q, k, v, o, lse, dout, dlse, dq, dk, dv, params, term, memory) &
        bind(c, name='kfa_backward_term_f64') result(s)
      import :: c_int, c_ptr, tensor_t, kfa_params, term_t
      type(tensor_t), intent(in) :: q, k, v, o, lse, dout, dq, dk, dv
      type(c_ptr), value :: dlse
      type(kfa_params), intent(in) :: params
      type(term_t), intent(in) :: term
      integer(c_int), value :: memory
      integer(c_int) :: s
    end function c_backward_term_f64

    function c_mpi_forward_term_f64(q, k, v, o, lse, params, term, seqpar, memory) &
        bind(c, name='kfa_mpi_forward_term_f64') result(s)
      import :: c_int, tensor_t, kfa_params, term_t, seqpar_t
      type(tensor_t), intent(in) :: q, k, v, o, lse
      type(kfa_params), intent(in) :: params
      type(term_t), intent(in) :: term
      type(seqpar_t), intent(in) :: seqpar
      integer(c_int), value :: memory
      integer(c_int) :: s
    end function c_mpi_forward_term_f64

    function c_mpi_backward_term_f64(q, k, v, o, lse, dout, dlse, dq, dk, dv, params, term, &
                                      seqpar, memory) bind(c, name='kfa_mpi_backward_term_f64') &
        result(s)
      import :: c_int, c_ptr, tensor_t, kfa_params, term_t, seqpar_t
      type(tensor_t), intent(in) :: q, k, v, o, lse, dout, dq, dk, dv
      type(c_ptr), value :: dlse
      type(kfa_params), intent(in) :: params
      type(term_t), intent(in) :: term
      type(seqpar_t), intent(in) :: seqpar
      integer(c_int), value :: memory
      integer(c_int) :: s
    end function c_mpi_backward_term_f64

    function c_varlen_forward_f64(q, k, v, cu_q, cu_k, o, lse, params, memory) &
        bind(c, name='kfa_varlen_forward_f64') result(s)
      import :: c_int, tensor_t, kfa_params
      type(tensor_t), intent(in) :: q, k, v, cu_q, cu_k, o, lse
      type(kfa_params), intent(in) :: params
      integer(c_int), value :: memory
      integer(c_int) :: s
    end function c_varlen_forward_f64

    function c_varlen_backward_f64(q, k, v, o, lse, dout, dlse, cu_q, cu_k, dq, dk, dv, params, &
                                    memory) bind(c, name='kfa_varlen_backward_f64') result(s)
      import :: c_int, c_ptr, tensor_t, kfa_params
      type(tensor_t), intent(in) :: q, k, v, o, lse, dout, cu_q, cu_k, dq, dk, dv
      type(c_ptr), value :: dlse
      type(kfa_params), intent(in) :: params
      integer(c_int), value :: memory
      integer(c_int) :: s
    end function c_varlen_backward_f64
  end interface

  !> kfa_forward(q, k, v, o, lse [, params] [, status] [, mask= | key_lengths= | bias= |
  !> alibi_slopes=]): o and lse from q, k, v.
  !> q, o: (head_dim, seqlen_q, heads_q, batch); k, v: (head_dim, seqlen_k, heads_k, batch) with
  !> heads_q a multiple of heads_k; lse: (seqlen_q, heads_q, batch).
  !> At most one score term (kfa_term in kfa.h), by keyword: mask, integer(c_int8_t)
  !> (seqlen_k, seqlen_q, heads_q or 1, batch or 1), nonzero where the key is visible;
  !> key_lengths, integer(c_int32_t) (batch), each in [0, seqlen_k]; bias, of q's kind, shaped
  !> as a mask; alibi_slopes, of q's kind, (heads_q). Giving two stops the program.
  interface kfa_forward
    module procedure forward_f32, forward_f64
  end interface kfa_forward

  !> kfa_backward(q, k, v, o, lse, dout, dq, dk, dv [, params] [, dlse] [, status]): the
  !> gradients dq (like q), dk and dv (like k) from the forward's tensors and dout = dL/dO;
  !> dlse = dL/dLSE (like lse) when the loss uses the LSE. params: the forward's.
  !> [, mask= | key_lengths= | bias= [, dbias=] | alibi_slopes=]: the forward's score term;
  !> dbias (shaped like bias) receives dL/dbias.
  interface kfa_backward
    module procedure backward_f32, backward_f64
  end interface kfa_backward

  !> kfa_mpi_forward(q, k, v, o, lse, comm, seqlen_q, seqlen_k [, params] [, layout] [, mode]
  !> [, status]): kfa::mpi's sequence-parallel forward. Each rank passes its rows of q, k, v
  !> (layout's rows of the global seqlen_q queries and seqlen_k keys; KFA_MPI_LAYOUT_CONTIGUOUS
  !> and KFA_MPI_MODE_RING by default) and receives its rows of o and lse. comm: the integer
  !> communicator (MPI_COMM_WORLD of `use mpi`, comm%MPI_VAL of `use mpi_f08`). Collective: an
  !> invalid argument on any rank fails every rank's call.
  interface kfa_mpi_forward
    module procedure mpi_forward_f32, mpi_forward_f64
  end interface kfa_mpi_forward

  !> kfa_mpi_backward(q, k, v, o, lse, dout, dq, dk, dv, comm, seqlen_q, seqlen_k [, params]
  !> [, layout] [, mode] [, dlse] [, status]): kfa::mpi's backward on each rank's rows.
  !> Both take the score terms of kfa_forward and kfa_backward, by keyword; a term is the whole
  !> problem's (global seqlen_q, seqlen_k), the same on every rank.
  interface kfa_mpi_backward
    module procedure mpi_backward_f32, mpi_backward_f64
  end interface kfa_mpi_backward

  !> kfa_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, o, lse [, params] [, status]):
  !> sequences of different lengths packed without padding (flash-attn's varlen interface).
  !> q, o: (head_dim, heads_q, total_q); k, v: (head_dim, heads_k, total_k); lse:
  !> (total_q, heads_q); cu_seqlens_q, cu_seqlens_k: integer(c_int32_t) (batch + 1) offsets
  !> from 0, non-decreasing, ending at total_q and total_k: sequence s (from 1) has the 0-based
  !> query rows cu_seqlens_q(s) .. cu_seqlens_q(s + 1) - 1, and so for the keys.
  interface kfa_varlen_forward
    module procedure varlen_forward_f32, varlen_forward_f64
  end interface kfa_varlen_forward

  !> kfa_varlen_backward(q, k, v, o, lse, dout, cu_seqlens_q, cu_seqlens_k, dq, dk, dv
  !> [, params] [, dlse] [, status]): the gradients of kfa_varlen_forward.
  interface kfa_varlen_backward
    module procedure varlen_backward_f32, varlen_backward_f64
  end interface kfa_varlen_backward

contains

  function seqpar(comm, seqlen_q, seqlen_k, layout, mode) result(sp)
    integer, intent(in) :: comm, seqlen_q, seqlen_k
    integer, intent(in), optional :: layout, mode
    type(seqpar_t) :: sp
    sp%comm = comm
    sp%seqlen_q = seqlen_q
    sp%seqlen_k = seqlen_k
    sp%layout = KFA_MPI_LAYOUT_CONTIGUOUS
    sp%mode = KFA_MPI_MODE_RING
    if (present(layout)) sp%layout = layout
    if (present(mode)) sp%mode = mode
  end function seqpar

  !> Initialises Kokkos unless the program has (kfa_initialize in kfa.h).
  subroutine kfa_initialize(status)
    integer, intent(out), optional :: status
    call finish(c_initialize(), status)
  end subroutine kfa_initialize

  !> Finalises Kokkos if kfa_initialize initialised it.
  subroutine kfa_finalize(status)
    integer, intent(out), optional :: status
    call finish(c_finalize(), status)
  end subroutine kfa_finalize

  !> Frees the memory kfa keeps between passes for their temporaries
  !> (kfa_release_workspaces in kfa.h).
  subroutine kfa_release_workspaces(status)
    integer, intent(out), optional :: status
    call finish(c_release_workspaces(), status)
  end subroutine kfa_release_workspaces

  !> Bytes kfa holds for those temporaries now (kfa_workspace_bytes in kfa.h; -1 on failure).
  function kfa_workspace_bytes() result(n)
    integer(c_int64_t) :: n
    n = c_workspace_bytes()
  end function kfa_workspace_bytes

  !> The message of this thread's last failed kfa call ("" after a success).
  function kfa_last_error() result(msg)
    character(:), allocatable :: msg
    type(c_ptr) :: p
    character(kind=c_char), pointer :: chars(:)
    integer :: n, i
    p = c_last_error()
    n = 0
    if (c_associated(p)) n = int(c_strlen(p))
    allocate (character(n) :: msg)
    if (n == 0) return
    call c_f_pointer(p, chars, [n])
    do i = 1, n
      msg(i:i) = chars(i)
    end do
  end function kfa_last_error

  ! Hands the status to the caller, or stops with the message when the caller takes none.
  subroutine finish(s, status)
    integer(c_int), intent(in) :: s
    integer, intent(out), optional :: status
    if (present(status)) then
      status = s
    else if (s /= KFA_OK) then
      write (error_unit, '(a)') kfa_last_error()
      error stop 1
    end if
  end subroutine finish

  ! The C description of an array in Fortran order: extents reversed, strides 0 (contiguous).
  function tensor(data, extents) result(t)
    type(c_ptr), intent(in) :: data
    integer(c_int64_t), intent(in) :: extents(:)
    type(tensor_t) :: t
    integer :: n
    n = size(extents)
    t%data = data
    t%extent(1:n) = extents(n:1:-1)
  end function tensor

  function params_or_default(params) result(p)
    type(kfa_params), intent(in), optional :: params
    type(kfa_params) :: p
    if (present(params)) then
      p = params
    else
      p = kfa_params_default()
    end if
  end function params_or_default

  ! The C description of the call's score term, from its optional arguments (none: term_none).
  ! Two terms, or a dbias without a bias, is an error in the call itself: it stops the program.
  function term_of(fn, n_real, has_dbias, mask, key_lengths) result(t)
    character(*), intent(in) :: fn
    integer, intent(in) :: n_real  ! how many of bias, alibi_slopes are given
    logical, intent(in) :: has_dbias
    integer(c_int8_t), intent(in), target, contiguous, optional :: mask(:, :, :, :)
    integer(c_int32_t), intent(in), target, contiguous, optional :: key_lengths(:)
    type(term_t) :: t
    integer :: n
    n = n_real
    if (present(mask)) n = n + 1
    if (present(key_lengths)) n = n + 1
    if (n > 1) then
      write (error_unit, '(a)') 'kfa: '//fn// &
        ': give at most one of mask, key_lengths, bias, alibi_slopes'
      error stop 1
    end if
    if (present(mask)) then
      t%kind = term_mask
      t%values = tensor(c_loc(mask), shape(mask, c_int64_t))
    else if (present(key_lengths)) then
      t%kind = term_key_padding
      t%values = tensor(c_loc(key_lengths), shape(key_lengths, c_int64_t))
    end if
    if (has_dbias .and. n_real == 0) then
      write (error_unit, '(a)') 'kfa: '//fn//': dbias is given without bias'
      error stop 1
    end if
  end function term_of

  function term_f32(fn, mask, key_lengths, bias, dbias, alibi_slopes) result(t)
    character(*), intent(in) :: fn
    integer(c_int8_t), intent(in), target, contiguous, optional :: mask(:, :, :, :)
    integer(c_int32_t), intent(in), target, contiguous, optional :: key_lengths(:)
    real(c_float), intent(in), target, contiguous, optional :: bias(:, :, :, :), alibi_slopes(:)
    real(c_float), intent(inout), target, contiguous, optional :: dbias(:, :, :, :)
    type(term_t) :: t
    integer :: n_real
    n_real = 0
    if (present(bias)) n_real = n_real + 1
    if (present(alibi_slopes)) n_real = n_real + 1
    t = term_of(fn, n_real, present(dbias), mask, key_lengths)
    if (present(bias)) then
      t%kind = term_bias
      t%values = tensor(c_loc(bias), shape(bias, c_int64_t))
      if (present(dbias)) t%dbias = tensor(c_loc(dbias), shape(dbias, c_int64_t))
    else if (present(alibi_slopes)) then
      t%kind = term_alibi
      t%values = tensor(c_loc(alibi_slopes), shape(alibi_slopes, c_int64_t))
    end if
  end function term_f32

  function term_f64(fn, mask, key_lengths, bias, dbias, alibi_slopes) result(t)
    character(*), intent(in) :: fn
    integer(c_int8_t), intent(in), target, contiguous, optional :: mask(:, :, :, :)
    integer(c_int32_t), intent(in), target, contiguous, optional :: key_lengths(:)
    real(c_double), intent(in), target, contiguous, optional :: bias(:, :, :, :), alibi_slopes(:)
    real(c_double), intent(inout), target, contiguous, optional :: dbias(:, :, :, :)
    type(term_t) :: t
    integer :: n_real
    n_real = 0
    if (present(bias)) n_real = n_real + 1
    if (present(alibi_slopes)) n_real = n_real + 1
    t = term_of(fn, n_real, present(dbias), mask, key_lengths)
    if (present(bias)) then
      t%kind = term_bias
      t%values = tensor(c_loc(bias), shape(bias, c_int64_t))
      if (present(dbias)) t%dbias = tensor(c_loc(dbias), shape(dbias, c_int64_t))
    else if (present(alibi_slopes)) then
      t%kind = term_alibi
      t%values = tensor(c_loc(alibi_slopes), shape(alibi_slopes, c_int64_t))
    end if
  end function term_f64

  subroutine forward_f32(q, k, v, o, lse, params, status, mask, key_lengths, bias, alibi_slopes)
    real(c_float), intent(in), target, contiguous :: q(:, :, :, :), k(:, :, :, :), v(:, :, :, :)
    real(c_float), intent(inout), target, contiguous :: o(:, :, :, :), lse(:, :, :)
    type(kfa_params), intent(in), optional :: params
    integer, intent(out), optional :: status
    integer(c_int8_t), intent(in), target, contiguous, optional :: mask(:, :, :, :)
    integer(c_int32_t), intent(in), target, contiguous, optional :: key_lengths(:)
    real(c_float), intent(in), target, contiguous, optional :: bias(:, :, :, :), alibi_slopes(:)
    call finish(c_forward_term_f32(tensor(c_loc(q), shape(q, c_int64_t)), &
                                   tensor(c_loc(k), shape(k, c_int64_t)), &
                                   tensor(c_loc(v), shape(v, c_int64_t)), &
                                   tensor(c_loc(o), shape(o, c_int64_t)), &
                                   tensor(c_loc(lse), shape(lse, c_int64_t)), &
                                   params_or_default(params), &
                                   term_f32('kfa_forward', mask, key_lengths, bias, &
                                            alibi_slopes=alibi_slopes), memory_host), status)
  end subroutine forward_f32

  subroutine backward_f32(q, k, v, o, lse, dout, dq, dk, dv, params, dlse, status, mask, &
                          key_lengths, bias, dbias, alibi_slopes)
    real(c_float), intent(in), target, contiguous :: q(:, :, :, :), k(:, :, :, :), &
                                                     v(:, :, :, :), o(:, :, :, :), lse(:, :, :), &
                                                     dout(:, :, :, :)
    real(c_float), intent(inout), target, contiguous :: dq(:, :, :, :), dk(:, :, :, :), &
                                                        dv(:, :, :, :)
    type(kfa_params), intent(in), optional :: params
    real(c_float), intent(in), target, contiguous, optional :: dlse(:, :, :)
    integer, intent(out), optional :: status
    integer(c_int8_t), intent(in), target, contiguous, optional :: mask(:, :, :, :)
    integer(c_int32_t), intent(in), target, contiguous, optional :: key_lengths(:)
    real(c_float), intent(in), target, contiguous, optional :: bias(:, :, :, :), alibi_slopes(:)
    real(c_float), intent(inout), target, contiguous, optional :: dbias(:, :, :, :)
    type(tensor_t), target :: tdlse
    type(c_ptr) :: pdlse
    pdlse = c_null_ptr
    if (present(dlse)) then
      tdlse = tensor(c_loc(dlse), shape(dlse, c_int64_t))
      pdlse = c_loc(tdlse)
    end if
    call finish(c_backward_term_f32(tensor(c_loc(q), shape(q, c_int64_t)), &
                                    tensor(c_loc(k), shape(k, c_int64_t)), &
                                    tensor(c_loc(v), shape(v, c_int64_t)), &
                                    tensor(c_loc(o), shape(o, c_int64_t)), &
                                    tensor(c_loc(lse), shape(lse, c_int64_t)), &
                                    tensor(c_loc(dout), shape(dout, c_int64_t)), pdlse, &
                                    tensor(c_loc(dq), shape(dq, c_int64_t)), &
                                    tensor(c_loc(dk), shape(dk, c_int64_t)), &
                                    tensor(c_loc(dv), shape(dv, c_int64_t)), &
                                    params_or_default(params), &
                                    term_f32('kfa_backward', mask, key_lengths, bias, dbias, &
                                             alibi_slopes), memory_host), status)
  end subroutine backward_f32

  subroutine mpi_forward_f32(q, k, v, o, lse, comm, seqlen_q, seqlen_k, params, layout, mode, &
                             status, mask, key_lengths, bias, alibi_slopes)
    real(c_float), intent(in), target, contiguous :: q(:, :, :, :), k(:, :, :, :), v(:, :, :, :)
    real(c_float), intent(inout), target, contiguous :: o(:, :, :, :), lse(:, :, :)
    integer, intent(in) :: comm, seqlen_q, seqlen_k
    type(kfa_params), intent(in), optional :: params
    integer, intent(in), optional :: layout, mode
    integer, intent(out), optional :: status
    integer(c_int8_t), intent(in), target, contiguous, optional :: mask(:, :, :, :)
    integer(c_int32_t), intent(in), target, contiguous, optional :: key_lengths(:)
    real(c_float), intent(in), target, contiguous, optional :: bias(:, :, :, :), alibi_slopes(:)
    call finish(c_mpi_forward_term_f32(tensor(c_loc(q), shape(q, c_int64_t)), &
                                       tensor(c_loc(k), shape(k, c_int64_t)), &
                                       tensor(c_loc(v), shape(v, c_int64_t)), &
                                       tensor(c_loc(o), shape(o, c_int64_t)), &
                                       tensor(c_loc(lse), shape(lse, c_int64_t)), &
                                       params_or_default(params), &
                                       term_f32('kfa_mpi_forward', mask, key_lengths, bias, &
                                                alibi_slopes=alibi_slopes), &
                                       seqpar(comm, seqlen_q, seqlen_k, layout, mode), &
                                       memory_host), status)
  end subroutine mpi_forward_f32

  subroutine mpi_backward_f32(q, k, v, o, lse, dout, dq, dk, dv, comm, seqlen_q, seqlen_k, &
                              params, layout, mode, dlse, status, mask, key_lengths, bias, &
                              dbias, alibi_slopes)
    real(c_float), intent(in), target, contiguous :: q(:, :, :, :), k(:, :, :, :), &
                                                 v(:, :, :, :), o(:, :, :, :), lse(:, :, :), &
                                                 dout(:, :, :, :)
    real(c_float), intent(inout), target, contiguous :: dq(:, :, :, :), dk(:, :, :, :), &
                                                    dv(:, :, :, :)
    integer, intent(in) :: comm, seqlen_q, seqlen_k
    type(kfa_params), intent(in), optional :: params
    integer, intent(in), optional :: layout, mode
    real(c_float), intent(in), target, contiguous, optional :: dlse(:, :, :)
    integer, intent(out), optional :: status
    integer(c_int8_t), intent(in), target, contiguous, optional :: mask(:, :, :, :)
    integer(c_int32_t), intent(in), target, contiguous, optional :: key_lengths(:)
    real(c_float), intent(in), target, contiguous, optional :: bias(:, :, :, :), alibi_slopes(:)
    real(c_float), intent(inout), target, contiguous, optional :: dbias(:, :, :, :)
    type(tensor_t), target :: tdlse
    type(c_ptr) :: pdlse
    pdlse = c_null_ptr
    if (present(dlse)) then
      tdlse = tensor(c_loc(dlse), shape(dlse, c_int64_t))
      pdlse = c_loc(tdlse)
    end if
    call finish(c_mpi_backward_term_f32(tensor(c_loc(q), shape(q, c_int64_t)), &
                                        tensor(c_loc(k), shape(k, c_int64_t)), &
                                        tensor(c_loc(v), shape(v, c_int64_t)), &
                                        tensor(c_loc(o), shape(o, c_int64_t)), &
                                        tensor(c_loc(lse), shape(lse, c_int64_t)), &
                                        tensor(c_loc(dout), shape(dout, c_int64_t)), pdlse, &
                                        tensor(c_loc(dq), shape(dq, c_int64_t)), &
                                        tensor(c_loc(dk), shape(dk, c_int64_t)), &
                                        tensor(c_loc(dv), shape(dv, c_int64_t)), &
                                        params_or_default(params), &
                                        term_f32('kfa_mpi_backward', mask, key_lengths, bias, &
                                                 dbias, alibi_slopes), &
                                        seqpar(comm, seqlen_q, seqlen_k, layout, mode), &
                                        memory_host), status)
  end subroutine mpi_backward_f32

  subroutine varlen_forward_f32(q, k, v, cu_seqlens_q, cu_seqlens_k, o, lse, params, status)
    real(c_float), intent(in), target, contiguous :: q(:, :, :), k(:, :, :), v(:, :, :)
    integer(c_int32_t), intent(in), target, contiguous :: cu_seqlens_q(:), cu_seqlens_k(:)
    real(c_float), intent(inout), target, contiguous :: o(:, :, :), lse(:, :)
    type(kfa_params), intent(in), optional :: params
    integer, intent(out), optional :: status
    call finish(c_varlen_forward_f32(tensor(c_loc(q), shape(q, c_int64_t)), &
                                     tensor(c_loc(k), shape(k, c_int64_t)), &
                                     tensor(c_loc(v), shape(v, c_int64_t)), &
                                     tensor(c_loc(cu_seqlens_q), shape(cu_seqlens_q, c_int64_t)), &
                                     tensor(c_loc(cu_seqlens_k), shape(cu_seqlens_k, c_int64_t)), &
                                     tensor(c_loc(o), shape(o, c_int64_t)), &
                                     tensor(c_loc(lse), shape(lse, c_int64_t)), &
                                     params_or_default(params), memory_host), status)
  end subroutine varlen_forward_f32

  subroutine varlen_backward_f32(q, k, v, o, lse, dout, cu_seqlens_q, cu_seqlens_k, dq, dk, dv, &
                                 params, dlse, status)
    real(c_float), intent(in), target, contiguous :: q(:, :, :), k(:, :, :), v(:, :, :), &
                                                     o(:, :, :), lse(:, :), dout(:, :, :)
    integer(c_int32_t), intent(in), target, contiguous :: cu_seqlens_q(:), cu_seqlens_k(:)
    real(c_float), intent(inout), target, contiguous :: dq(:, :, :), dk(:, :, :), dv(:, :, :)
    type(kfa_params), intent(in), optional :: params
    real(c_float), intent(in), target, contiguous, optional :: dlse(:, :)
    integer, intent(out), optional :: status
    type(tensor_t), target :: tdlse
    type(c_ptr) :: pdlse
    pdlse = c_null_ptr
    if (present(dlse)) then
      tdlse = tensor(c_loc(dlse), shape(dlse, c_int64_t))
      pdlse = c_loc(tdlse)
    end if
    call finish(c_varlen_backward_f32(tensor(c_loc(q), shape(q, c_int64_t)), &
                                      tensor(c_loc(k), shape(k, c_int64_t)), &
                                      tensor(c_loc(v), shape(v, c_int64_t)), &
                                      tensor(c_loc(o), shape(o, c_int64_t)), &
                                      tensor(c_loc(lse), shape(lse, c_int64_t)), &
                                      tensor(c_loc(dout), shape(dout, c_int64_t)), pdlse, &
                                      tensor(c_loc(cu_seqlens_q), shape(cu_seqlens_q, c_int64_t)), &
                                      tensor(c_loc(cu_seqlens_k), shape(cu_seqlens_k, c_int64_t)), &
                                      tensor(c_loc(dq), shape(dq, c_int64_t)), &
                                      tensor(c_loc(dk), shape(dk, c_int64_t)), &
                                      tensor(c_loc(dv), shape(dv, c_int64_t)), &
                                      params_or_default(params), memory_host), status)
  end subroutine varlen_backward_f32

  subroutine forward_f64(q, k, v, o, lse, params, status, mask, key_lengths, bias, alibi_slopes)
    real(c_double), intent(in), target, contiguous :: q(:, :, :, :), k(:, :, :, :), v(:, :, :, :)
    real(c_double), intent(inout), target, contiguous :: o(:, :, :, :), lse(:, :, :)
    type(kfa_params), intent(in), optional :: params
    integer, intent(out), optional :: status
    integer(c_int8_t), intent(in), target, contiguous, optional :: mask(:, :, :, :)
    integer(c_int32_t), intent(in), target, contiguous, optional :: key_lengths(:)
    real(c_double), intent(in), target, contiguous, optional :: bias(:, :, :, :), alibi_slopes(:)
    call finish(c_forward_term_f64(tensor(c_loc(q), shape(q, c_int64_t)), &
                                   tensor(c_loc(k), shape(k, c_int64_t)), &
                                   tensor(c_loc(v), shape(v, c_int64_t)), &
                                   tensor(c_loc(o), shape(o, c_int64_t)), &
                                   tensor(c_loc(lse), shape(lse, c_int64_t)), &
                                   params_or_default(params), &
                                   term_f64('kfa_forward', mask, key_lengths, bias, &
                                            alibi_slopes=alibi_slopes), memory_host), status)
  end subroutine forward_f64

  subroutine backward_f64(q, k, v, o, lse, dout, dq, dk, dv, params, dlse, status, mask, &
                          key_lengths, bias, dbias, alibi_slopes)
    real(c_double), intent(in), target, contiguous :: q(:, :, :, :), k(:, :, :, :), &
                                                     v(:, :, :, :), o(:, :, :, :), lse(:, :, :), &
                                                     dout(:, :, :, :)
    real(c_double), intent(inout), target, contiguous :: dq(:, :, :, :), dk(:, :, :, :), &
                                                        dv(:, :, :, :)
    type(kfa_params), intent(in), optional :: params
    real(c_double), intent(in), target, contiguous, optional :: dlse(:, :, :)
    integer, intent(out), optional :: status
    integer(c_int8_t), intent(in), target, contiguous, optional :: mask(:, :, :, :)
    integer(c_int32_t), intent(in), target, contiguous, optional :: key_lengths(:)
    real(c_double), intent(in), target, contiguous, optional :: bias(:, :, :, :), alibi_slopes(:)
    real(c_double), intent(inout), target, contiguous, optional :: dbias(:, :, :, :)
    type(tensor_t), target :: tdlse
    type(c_ptr) :: pdlse
    pdlse = c_null_ptr
    if (present(dlse)) then
      tdlse = tensor(c_loc(dlse), shape(dlse, c_int64_t))
      pdlse = c_loc(tdlse)
    end if
    call finish(c_backward_term_f64(tensor(c_loc(q), shape(q, c_int64_t)), &
                                    tensor(c_loc(k), shape(k, c_int64_t)), &
                                    tensor(c_loc(v), shape(v, c_int64_t)), &
                                    tensor(c_loc(o), shape(o, c_int64_t)), &
                                    tensor(c_loc(lse), shape(lse, c_int64_t)), &
                                    tensor(c_loc(dout), shape(dout, c_int64_t)), pdlse, &
                                    tensor(c_loc(dq), shape(dq, c_int64_t)), &
                                    tensor(c_loc(dk), shape(dk, c_int64_t)), &
                                    tensor(c_loc(dv), shape(dv, c_int64_t)), &
                                    params_or_default(params), &
                                    term_f64('kfa_backward', mask, key_lengths, bias, dbias, &
                                             alibi_slopes), memory_host), status)
  end subroutine backward_f64

  subroutine mpi_forward_f64(q, k, v, o, lse, comm, seqlen_q, seqlen_k, params, layout, mode, &
                             status, mask, key_lengths, bias, alibi_slopes)
    real(c_double), intent(in), target, contiguous :: q(:, :, :, :), k(:, :, :, :), v(:, :, :, :)
    real(c_double), intent(inout), target, contiguous :: o(:, :, :, :), lse(:, :, :)
    integer, intent(in) :: comm, seqlen_q, seqlen_k
    type(kfa_params), intent(in), optional :: params
    integer, intent(in), optional :: layout, mode
    integer, intent(out), optional :: status
    integer(c_int8_t), intent(in), target, contiguous, optional :: mask(:, :, :, :)
    integer(c_int32_t), intent(in), target, contiguous, optional :: key_lengths(:)
    real(c_double), intent(in), target, contiguous, optional :: bias(:, :, :, :), alibi_slopes(:)
    call finish(c_mpi_forward_term_f64(tensor(c_loc(q), shape(q, c_int64_t)), &
                                       tensor(c_loc(k), shape(k, c_int64_t)), &
                                       tensor(c_loc(v), shape(v, c_int64_t)), &
                                       tensor(c_loc(o), shape(o, c_int64_t)), &
                                       tensor(c_loc(lse), shape(lse, c_int64_t)), &
                                       params_or_default(params), &
                                       term_f64('kfa_mpi_forward', mask, key_lengths, bias, &
                                                alibi_slopes=alibi_slopes), &
                                       seqpar(comm, seqlen_q, seqlen_k, layout, mode), &
                                       memory_host), status)
  end subroutine mpi_forward_f64

  subroutine mpi_backward_f64(q, k, v, o, lse, dout, dq, dk, dv, comm, seqlen_q, seqlen_k, &
                              params, layout, mode, dlse, status, mask, key_lengths, bias, &
                              dbias, alibi_slopes)
    real(c_double), intent(in), target, contiguous :: q(:, :, :, :), k(:, :, :, :), &
                                                 v(:, :, :, :), o(:, :, :, :), lse(:, :, :), &
                                                 dout(:, :, :, :)
    real(c_double), intent(inout), target, contiguous :: dq(:, :, :, :), dk(:, :, :, :), &
                                                    dv(:, :, :, :)
    integer, intent(in) :: comm, seqlen_q, seqlen_k
    type(kfa_params), intent(in), optional :: params
    integer, intent(in), optional :: layout, mode
    real(c_double), intent(in), target, contiguous, optional :: dlse(:, :, :)
    integer, intent(out), optional :: status
    integer(c_int8_t), intent(in), target, contiguous, optional :: mask(:, :, :, :)
    integer(c_int32_t), intent(in), target, contiguous, optional :: key_lengths(:)
    real(c_double), intent(in), target, contiguous, optional :: bias(:, :, :, :), alibi_slopes(:)
    real(c_double), intent(inout), target, contiguous, optional :: dbias(:, :, :, :)
    type(tensor_t), target :: tdlse
    type(c_ptr) :: pdlse
    pdlse = c_null_ptr
    if (present(dlse)) then
      tdlse = tensor(c_loc(dlse), shape(dlse, c_int64_t))
      pdlse = c_loc(tdlse)
    end if
    call finish(c_mpi_backward_term_f64(tensor(c_loc(q), shape(q, c_int64_t)), &
                                        tensor(c_loc(k), shape(k, c_int64_t)), &
                                        tensor(c_loc(v), shape(v, c_int64_t)), &
                                        tensor(c_loc(o), shape(o, c_int64_t)), &
                                        tensor(c_loc(lse), shape(lse, c_int64_t)), &
                                        tensor(c_loc(dout), shape(dout, c_int64_t)), pdlse, &
                                        tensor(c_loc(dq), shape(dq, c_int64_t)), &
                                        tensor(c_loc(dk), shape(dk, c_int64_t)), &
                                        tensor(c_loc(dv), shape(dv, c_int64_t)), &
                                        params_or_default(params), &
                                        term_f64('kfa_mpi_backward', mask, key_lengths, bias, &
                                                 dbias, alibi_slopes), &
                                        seqpar(comm, seqlen_q, seqlen_k, layout, mode), &
                                        memory_host), status)
  end subroutine mpi_backward_f64

  subroutine varlen_forward_f64(q, k, v, cu_seqlens_q, cu_seqlens_k, o, lse, params, status)
    real(c_double), intent(in), target, contiguous :: q(:, :, :), k(:, :, :), v(:, :, :)
    integer(c_int32_t), intent(in), target, contiguous :: cu_seqlens_q(:), cu_seqlens_k(:)
    real(c_double), intent(inout), target, contiguous :: o(:, :, :), lse(:, :)
    type(kfa_params), intent(in), optional :: params
    integer, intent(out), optional :: status
    call finish(c_varlen_forward_f64(tensor(c_loc(q), shape(q, c_int64_t)), &
                                     tensor(c_loc(k), shape(k, c_int64_t)), &
                                     tensor(c_loc(v), shape(v, c_int64_t)), &
                                     tensor(c_loc(cu_seqlens_q), shape(cu_seqlens_q, c_int64_t)), &
                                     tensor(c_loc(cu_seqlens_k), shape(cu_seqlens_k, c_int64_t)), &
                                     tensor(c_loc(o), shape(o, c_int64_t)), &
                                     tensor(c_loc(lse), shape(lse, c_int64_t)), &
                                     params_or_default(params), memory_host), status)
  end subroutine varlen_forward_f64

  subroutine varlen_backward_f64(q, k, v, o, lse, dout, cu_seqlens_q, cu_seqlens_k, dq, dk, dv, &
                                 params, dlse, status)
    real(c_double), intent(in), target, contiguous :: q(:, :, :), k(:, :, :), v(:, :, :), &
                                                     o(:, :, :), lse(:, :), dout(:, :, :)
    integer(c_int32_t), intent(in), target, contiguous :: cu_seqlens_q(:), cu_seqlens_k(:)
    real(c_double), intent(inout), target, contiguous :: dq(:, :, :), dk(:, :, :), dv(:, :, :)
    type(kfa_params), intent(in), optional :: params
    real(c_double), intent(in), target, contiguous, optional :: dlse(:, :)
    integer, intent(out), optional :: status
    type(tensor_t), target :: tdlse
    type(c_ptr) :: pdlse
    pdlse = c_null_ptr
    if (present(dlse)) then
      tdlse = tensor(c_loc(dlse), shape(dlse, c_int64_t))
      pdlse = c_loc(tdlse)
    end if
    call finish(c_varlen_backward_f64(tensor(c_loc(q), shape(q, c_int64_t)), &
                                      tensor(c_loc(k), shape(k, c_int64_t)), &
                                      tensor(c_loc(v), shape(v, c_int64_t)), &
                                      tensor(c_loc(o), shape(o, c_int64_t)), &
                                      tensor(c_loc(lse), shape(lse, c_int64_t)), &
                                      tensor(c_loc(dout), shape(dout, c_int64_t)), pdlse, &
                                      tensor(c_loc(cu_seqlens_q), shape(cu_seqlens_q, c_int64_t)), &
                                      tensor(c_loc(cu_seqlens_k), shape(cu_seqlens_k, c_int64_t)), &
                                      tensor(c_loc(dq), shape(dq, c_int64_t)), &
                                      tensor(c_loc(dk), shape(dk, c_int64_t)), &
                                      tensor(c_loc(dv), shape(dv, c_int64_t)), &
                                      params_or_default(params), memory_host), status)
  end subroutine varlen_backward_f64

end module kfa
