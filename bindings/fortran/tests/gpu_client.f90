! fortran_gpu_client: kernels of a client process (docs/server.md, "Client
! kernels").  In client mode, gpu_context gives the relay context; the CUDA
! kernels of bindings/tests/client_kernel.cu get it and submit to the server
! from the device (chi.add, chi.echo and this program's own handler on
! CHI_ROUTE_CPU, chi.echo and chi.add on the server's orchestrator), and
! check every result and the refusals.  Runs against tests/run_with_server.sh
! (CHI_MODE=client, CHI_SERVER_ADDRESS), whose server drives every GPU when
! CHI_TEST_SERVER_GPUS=-1.  Exit 77 (skipped) outside client mode, when the
! server drives no GPU (after checking the refusals) or this process sees no
! CUDA device; with CHI_TEST_REQUIRE_GPU=1 (the GPU machine) those end in
! error stop instead.  Any failed expectation ends in error stop.
module gpu_client_support
  use, intrinsic :: iso_c_binding
  use chimaera
  implicit none

  ! bindings/tests/client_kernel.cu.
  interface
    function ck_device_count() bind(C, name="ck_device_count") result(n)
      import :: c_int32_t
      integer(c_int32_t) :: n
    end function ck_device_count
    function ck_routes(ctx, gpu, add, echo, mine, blocks, threads, iters, counts) &
        bind(C, name="ck_routes") result(e)
      import :: chi_dev_context_t, c_int32_t, c_int64_t
      type(chi_dev_context_t), intent(in) :: ctx
      integer(c_int32_t), value :: gpu, add, echo, mine, blocks, threads, iters
      integer(c_int64_t), intent(out) :: counts(4)
      integer(c_int32_t) :: e
    end function ck_routes
    function ck_edges(ctx, gpu, add, mine, ngpus, res) bind(C, name="ck_edges") result(e)
      import :: chi_dev_context_t, c_int32_t
      type(chi_dev_context_t), intent(in) :: ctx
      integer(c_int32_t), value :: gpu, add, mine, ngpus
      integer(c_int32_t), intent(out) :: res(9)
      integer(c_int32_t) :: e
    end function ck_edges
  end interface

contains

  subroutine expect(cond, what)
    logical, intent(in) :: cond
    character(len=*), intent(in) :: what
    if (.not. cond) error stop "FAILED: " // what
  end subroutine expect

  subroutine expect_stat(stat, want, what)
    integer(c_int32_t), intent(in) :: stat, want
    character(len=*), intent(in) :: what
    if (stat /= want) then
      print '(a, ": ", i0, " (", a, "), want ", i0, ": ", a)', what, stat, &
            chi_status_text(stat), want, chi_last_error()
      error stop "FAILED: " // what
    end if
  end subroutine expect_stat

  logical function env_is(name, value)
    character(len=*), intent(in) :: name, value
    character(len=32) :: text
    integer :: length, status
    call get_environment_variable(name, text, length, status)
    env_is = status == 0 .and. trim(text) == value
  end function env_is

  ! Exit 77, or error stop where the GPU machine requires the case.
  subroutine skip(why)
    character(len=*), intent(in) :: why
    if (env_is("CHI_TEST_REQUIRE_GPU", "1")) error stop "CHI_TEST_REQUIRE_GPU=1 but " // why
    print '(a, ": skipping")', why
    stop 77
  end subroutine skip

  ! The handler the kernel calls on CHI_ROUTE_CPU, run by the client's relay
  ! with the kernel's GPU as the source: input an int64 v, output 3 * v.
  recursive function triple(req, user_data) bind(C, name="") result(status)
    type(chi_request_t), intent(inout) :: req
    type(c_ptr), value :: user_data
    integer(c_int32_t) :: status
    integer(c_int64_t), pointer :: v(:)

    if (c_associated(user_data) .or. req%source /= 0) then
      status = -1001
      return
    end if
    call chi_request_input(req, v, status)
    if (status /= CHI_OK) return
    if (size(v) /= 1) then
      status = CHI_ERR_INVALID
      return
    end if
    status = chi_request_set_output(req, [3_c_int64_t * v(1)])
  end function triple
end module gpu_client_support

program gpu_client
  use, intrinsic :: iso_c_binding
  use chimaera
  use gpu_client_support
  implicit none
  type(chi_runtime) :: rt
  type(chi_dev_context_t) :: ctx, again
  integer(c_int32_t) :: stat, ngpus, mine, e, res(9)
  integer(c_int32_t), parameter :: blocks = 8, threads = 128, iters = 24
  integer(c_int64_t) :: counts(4), want

  if (.not. env_is("CHI_MODE", "client")) &
    call skip("not in client mode (CHI_MODE=client, CHI_SERVER_ADDRESS: tests/run_with_server.sh)")
  call rt%init(mode=CHI_MODE_CLIENT)
  ngpus = rt%gpu_count()

  ! The orchestrators are the server's: a client pauses none.
  call rt%gpu_pause(-1_c_int32_t, stat)
  call expect_stat(stat, CHI_ERR_NO_DEVICE, "gpu_pause in a client")
  call rt%gpu_resume(-1_c_int32_t, stat)
  call expect_stat(stat, CHI_ERR_NO_DEVICE, "gpu_resume in a client")
  if (ngpus == 0) then
    call rt%gpu_context(0_c_int32_t, ctx, stat)
    call expect_stat(stat, CHI_ERR_NO_DEVICE, "gpu_context with a server without GPUs")
    call rt%destroy()
    call skip("the server drives no GPU (checked: gpu_context, gpu_pause and gpu_resume refuse)")
  end if
  call rt%gpu_context(ngpus, ctx, stat)
  call expect_stat(stat, CHI_ERR_INVALID, "gpu_context out of range")
  call rt%gpu_pause(0_c_int32_t, stat)
  call expect_stat(stat, CHI_ERR_NO_DEVICE, "gpu_pause(0) in a client")
  if (ck_device_count() == 0) then
    call rt%destroy()
    call skip("this process sees no CUDA device")
  end if

  call rt%register_handler("fortran.triple", triple, method=mine)
  call rt%gpu_context(0_c_int32_t, ctx)
  call rt%gpu_context(0_c_int32_t, again)
  call expect(all(ctx%opaque == again%opaque), "later gpu_context calls give the same context")

  e = ck_routes(ctx, 0_c_int32_t, CHI_METHOD_ADD, CHI_METHOD_ECHO, mine, blocks, threads, iters, counts)
  want = int(blocks, c_int64_t) * threads * iters
  print '("# client kernel: ", i0, " of ", i0, " tasks right (wrong: ", i0, ", first: case ", i0, &
        & " status ", i0, ")")', counts(1), want, counts(2), counts(3), counts(4)
  call expect(e == 0, "cudaError_t of the routes kernel")
  call expect(counts(1) == want .and. counts(2) == 0, "every task of the client kernel right")

  e = ck_edges(ctx, 0_c_int32_t, CHI_METHOD_ADD, mine, ngpus, res)
  print '("# client kernel refusals:", 9(1x, i0))', res
  call expect(e == 0, "cudaError_t of the edges kernel")
  call expect(all(res == [CHI_ERR_INVALID, CHI_ERR_INVALID, CHI_ERR_NO_DEVICE, CHI_ERR_TOO_LARGE, &
                          CHI_ERR_NOT_FOUND, CHI_ERR_NOT_FOUND, 0_c_int32_t, 0_c_int32_t, 0_c_int32_t]), &
              "the refusals of the client kernel")

  call rt%destroy(stat)
  call expect_stat(stat, CHI_OK, "finalize after the kernels")
  print '(a)', "fortran_gpu_client: all passed"
end program gpu_client
