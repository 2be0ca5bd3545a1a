! fortran_basic: the chimaera module end to end from Fortran.  Any failed
! expectation ends the program with `error stop` (a failed ctest).
module basic_support
  use, intrinsic :: iso_c_binding
  use chimaera
  implicit none

  ! A task input made of mixed fields, sent with submit_buffer.
  type, bind(C) :: sample_t
    integer(c_int64_t) :: id
    real(c_double) :: value
    integer(c_int32_t) :: flags(3)
  end type sample_t

  interface
    function ftest_block_handler(req, user_data) bind(C, name="ftest_block_handler") &
        result(status)
      import :: chi_request_t, c_ptr, c_int32_t
      type(chi_request_t), intent(inout) :: req
      type(c_ptr), value :: user_data
      integer(c_int32_t) :: status
    end function ftest_block_handler
    subroutine ftest_unblock() bind(C, name="ftest_unblock")
    end subroutine ftest_unblock
    function ftest_layout(values, cap) bind(C, name="ftest_layout") result(n)
      import :: c_int64_t, c_int
      integer(c_int64_t), intent(out) :: values(*)
      integer(c_int), value :: cap
      integer(c_int) :: n
    end function ftest_layout
  end interface

contains

  subroutine expect(cond, what)
    logical, intent(in) :: cond
    character(len=*), intent(in) :: what
    if (.not. cond) error stop "FAILED: " // what
  end subroutine expect

  subroutine expect_stat(got, want, what)
    integer(c_int32_t), intent(in) :: got, want
    character(len=*), intent(in) :: what
    character(len=80) :: line
    if (got /= want) then
      write (line, '("status ",i0," (expected ",i0,")")') got, want
      error stop "FAILED: " // what // ": " // trim(line) // ": " // chi_status_text(got) // &
                 ": " // chi_last_error()
    end if
  end subroutine expect_stat

  ! f.square: output(i) = input(i)**2 over real64 values.
  recursive function square_handler(req, user_data) bind(C, name="") result(status)
    type(chi_request_t), intent(inout) :: req
    type(c_ptr), value :: user_data
    integer(c_int32_t) :: status
    real(c_double), pointer :: x(:), y(:)

    if (c_associated(user_data)) then
      status = CHI_ERR_INTERNAL
      return
    end if
    call chi_request_input(req, x, status)
    if (status /= CHI_OK) return
    call chi_request_output(req, y, status)
    if (status /= CHI_OK) return
    if (size(y) < size(x)) then
      status = CHI_ERR_TOO_LARGE
      return
    end if
    y(1:size(x)) = x**2
    req%output_size = int(size(x), c_size_t) * c_sizeof(x(1))
    status = CHI_OK
  end function square_handler

  ! f.offset_sum: sum of int64 inputs plus the int64 user_data points to.
  recursive function offset_sum_handler(req, user_data) bind(C, name="") result(status)
    type(chi_request_t), intent(inout) :: req
    type(c_ptr), value :: user_data
    integer(c_int32_t) :: status
    integer(c_int64_t), pointer :: x(:), offset

    call chi_request_input(req, x, status)
    if (status /= CHI_OK) return
    call c_f_pointer(user_data, offset)
    status = chi_request_set_output(req, [sum(x) + offset])
  end function offset_sum_handler

  ! f.fail: always a handler-defined error code.
  recursive function fail_handler(req, user_data) bind(C, name="") result(status)
    type(chi_request_t), intent(inout) :: req
    type(c_ptr), value :: user_data
    integer(c_int32_t) :: status
    status = CHI_ERR_USER_BASE - 7
    if (c_associated(user_data)) status = CHI_ERR_INTERNAL
    req%output_size = 0
  end function fail_handler

  ! Addresses as integers, for offsets.
  integer(c_intptr_t) function address(p)
    type(c_ptr), intent(in) :: p
    address = transfer(p, 0_c_intptr_t)
  end function address
end module basic_support

program fortran_basic
  use, intrinsic :: iso_c_binding
  use chimaera
  use basic_support
  implicit none

  type(chi_runtime), target :: rt
  type(chi_runtime), allocatable :: dynamic
  type(chi_dev_context_t) :: ctx
  integer(c_int32_t) :: stat, m_square, m_sum, m_fail, m_block, id
  integer(c_int64_t) :: fut, fut2
  integer(c_int64_t), target :: offset
  integer(c_size_t) :: nbytes
  integer(c_int8_t) :: bytes_in(16), bytes_out(16), small(8)
  integer(c_int8_t), allocatable :: huge_in(:)
  integer(c_int64_t) :: sum_out(1), region
  real(c_double) :: x(5), y(5)
  real(c_double), target :: host(64)
  type(sample_t), target :: sample, sample_back
  type(chi_mem_ref_t) :: ref
  type(c_ptr) :: resolved
  integer(c_int32_t) :: where_gpu
  character(len=32) :: version
  logical :: done
  integer :: i

  call check_layout()

  ! Versions and status texts, no runtime needed.
  call expect(chi_version() == CHI_VERSION_NUMBER, "chi_version matches CHI_VERSION_NUMBER")
  write (version, '(i0,".",i0,".",i0)') CHI_VERSION_MAJOR, CHI_VERSION_MINOR, CHI_VERSION_PATCH
  call expect(chi_version_text() == trim(version), "chi_version_text")
  call expect(chi_status_text(CHI_OK) == "success", "status text of CHI_OK")
  call expect(chi_status_text(-999) == "unknown status", "status text of an unknown code")
  call expect(chi_status_text(CHI_ERR_USER_BASE - 5) == "handler-defined error", &
              "status text of a handler code")

  ! A runtime that is not running refuses every call.
  call expect(.not. rt%is_running(), "a new chi_runtime is not running")
  call rt%submit(CHI_ROUTE_CPU, CHI_METHOD_ECHO, bytes_in, fut, stat)
  call expect_stat(stat, CHI_ERR_INVALID, "submit before init")
  call expect(len(chi_last_error()) > 0, "submit before init leaves a message")

  ! A bad configuration file is reported with a message.
  call rt%init(config_path="/nonexistent/chimaera.yaml", stat=stat)
  call expect_stat(stat, CHI_ERR_CONFIG, "init with a missing config file")
  call expect(index(chi_last_error(), "/nonexistent/chimaera.yaml") > 0, &
              "the config message names the file: " // chi_last_error())
  call expect(.not. rt%is_running(), "a failed init leaves the runtime stopped")

  call rt%init(num_workers=2, gpus=0)
  call expect(rt%is_running(), "init starts the runtime")
  call rt%init(num_workers=2, gpus=0, stat=stat)
  call expect_stat(stat, CHI_ERR_INVALID, "a second init")

  ! chi.echo with int8 arrays.
  bytes_in = [(int(i * 7, c_int8_t), i = 1, 16)]
  bytes_out = 0
  call rt%submit(CHI_ROUTE_CPU, CHI_METHOD_ECHO, bytes_in, fut)
  call expect(fut /= 0, "a future is never 0")
  call rt%wait(fut, bytes_out, output_size=nbytes)
  call expect(nbytes == 16, "echo output size")
  call expect(all(bytes_out == bytes_in), "echo output")

  ! chi.add with int64, through CHI_ROUTE_LOCAL.
  call rt%submit(CHI_ROUTE_LOCAL, CHI_METHOD_ADD, [40_c_int64_t, 2_c_int64_t], fut)
  call rt%wait(fut, sum_out, timeout_ns=10000000000_c_int64_t)
  call expect(sum_out(1) == 42, "chi.add")

  ! chi.checksum: 64-bit FNV-1a of "chimaera".
  call rt%submit(CHI_ROUTE_CPU, CHI_METHOD_CHECKSUM, &
                 transfer("chimaera", [0_c_int8_t], 8), fut)
  call rt%wait(fut, sum_out)
  call expect(sum_out(1) == -4746246906542324357_c_int64_t, "chi.checksum of 'chimaera'")

  ! Built-in names resolve to the fixed ids.
  call rt%lookup("chi.echo", id)
  call expect(id == CHI_METHOD_ECHO, "lookup chi.echo")
  call rt%lookup("no.such.method", id, stat)
  call expect_stat(stat, CHI_ERR_NOT_FOUND, "lookup of an unknown name")

  ! A Fortran handler.
  call rt%register_handler("f.square", square_handler, method=m_square)
  call expect(m_square > CHI_METHOD_CHECKSUM, "a new method id follows the built-ins")
  call rt%lookup("f.square", id)
  call expect(id == m_square, "lookup finds f.square")
  call rt%register_handler("f.square", square_handler, stat=stat)
  call expect_stat(stat, CHI_ERR_INVALID, "registering a name twice")
  call rt%register_handler("", square_handler, stat=stat)
  call expect_stat(stat, CHI_ERR_INVALID, "registering an empty name")

  x = [1.0_c_double, -2.0_c_double, 0.5_c_double, 3.0_c_double, 1.0e10_c_double]
  y = 0
  call rt%submit(CHI_ROUTE_CPU, m_square, x, fut)
  call rt%wait(fut, y, output_size=nbytes)
  call expect(nbytes == 40, "f.square output size")
  call expect(all(y == x**2), "f.square output")

  ! Input that is not a whole number of doubles: the view fails, the handler
  ! returns that status, wait passes it on.
  call rt%submit(CHI_ROUTE_CPU, m_square, bytes_in(1:7), fut)
  call rt%wait(fut, y, stat=stat)
  call expect_stat(stat, CHI_ERR_INVALID, "f.square with 7 bytes")

  ! user_data reaches the handler.
  offset = 1000
  call rt%register_handler("f.offset_sum", offset_sum_handler, user_data=c_loc(offset), &
                           method=m_sum)
  call rt%submit(CHI_ROUTE_CPU, m_sum, [1_c_int64_t, 2_c_int64_t, 3_c_int64_t], fut)
  call rt%wait(fut, sum_out)
  call expect(sum_out(1) == 1006, "f.offset_sum uses user_data")

  ! A handler's own error code comes back unchanged.
  call rt%register_handler("f.fail", fail_handler, method=m_fail)
  call rt%submit(CHI_ROUTE_CPU, m_fail, bytes_in, fut)
  call rt%wait(fut, stat=stat)
  call expect_stat(stat, CHI_ERR_USER_BASE - 7, "handler-defined status")

  ! A consumed future is stale for wait, test and release.
  call rt%wait(fut, stat=stat)
  call expect_stat(stat, CHI_ERR_INVALID, "wait on a consumed future")
  call rt%test(fut, done, stat)
  call expect_stat(stat, CHI_ERR_INVALID, "test on a consumed future")
  call rt%release(fut, stat)
  call expect_stat(stat, CHI_ERR_INVALID, "release of a consumed future")
  call rt%wait(0_c_int64_t, stat=stat)
  call expect_stat(stat, CHI_ERR_INVALID, "wait on future 0")

  ! An output buffer too small: the size needed, the future stays valid.
  call rt%submit(CHI_ROUTE_CPU, CHI_METHOD_ECHO, bytes_in, fut)
  call rt%wait(fut, small, output_size=nbytes, stat=stat)
  call expect_stat(stat, CHI_ERR_TOO_LARGE, "wait into a small buffer")
  call expect(nbytes == 16, "TOO_LARGE reports the size needed")
  call rt%wait(fut, bytes_out, stat=stat)
  call expect_stat(stat, CHI_OK, "wait again with a large enough buffer")
  call expect(all(bytes_out == bytes_in), "echo after TOO_LARGE")

  ! A payload over any inline limit (at most 1 MiB).
  allocate(huge_in(1048576 + 64))
  huge_in = 1
  call rt%submit(CHI_ROUTE_CPU, CHI_METHOD_ECHO, huge_in, fut, stat)
  call expect_stat(stat, CHI_ERR_TOO_LARGE, "submit of an oversized payload")
  deallocate(huge_in)

  ! No GPU with gpus=0.
  call expect(rt%gpu_count() == 0, "gpu_count with gpus=0")
  call rt%submit(CHI_ROUTE_GPU_ANY, CHI_METHOD_ECHO, bytes_in, fut, stat)
  call expect_stat(stat, CHI_ERR_NO_DEVICE, "GPU route with gpus=0")
  call rt%gpu_context(0_c_int32_t, ctx, stat)
  call expect_stat(stat, CHI_ERR_NO_DEVICE, "gpu_context with gpus=0")
  call rt%gpu_pause(-1_c_int32_t, stat)
  call expect_stat(stat, CHI_ERR_NO_DEVICE, "gpu_pause with gpus=0")
  call rt%gpu_resume(-1_c_int32_t, stat)
  call expect_stat(stat, CHI_ERR_NO_DEVICE, "gpu_resume with gpus=0")

  ! Unknown method id.
  call rt%submit(CHI_ROUTE_CPU, 4000_c_int32_t, bytes_in, fut, stat)
  call expect_stat(stat, CHI_ERR_NOT_FOUND, "submit of an unregistered method id")

  ! A task that blocks: a bounded wait times out and leaves the future valid.
  call rt%register_handler("c.block", ftest_block_handler, method=m_block)
  call rt%submit(CHI_ROUTE_CPU, m_block, bytes_in, fut)
  call rt%wait(fut, bytes_out, timeout_ns=1000000_c_int64_t, stat=stat)
  call expect_stat(stat, CHI_ERR_TIMEOUT, "wait on a blocked task")
  call rt%wait(fut, bytes_out, timeout_ns=0_c_int64_t, stat=stat)
  call expect_stat(stat, CHI_ERR_TIMEOUT, "poll of a blocked task")
  call rt%test(fut, done)
  call expect(.not. done, "test of a blocked task")
  call ftest_unblock()
  bytes_out = 0
  call rt%wait(fut, bytes_out)
  call expect(all(bytes_out == bytes_in), "the blocked task's result after release")

  ! test until done, then wait.
  call rt%submit(CHI_ROUTE_CPU, CHI_METHOD_ECHO, bytes_in, fut)
  done = .false.
  do while (.not. done)
    call rt%test(fut, done)
  end do
  call rt%wait(fut, bytes_out, timeout_ns=0_c_int64_t)
  call expect(all(bytes_out == bytes_in), "echo after test")

  ! release consumes the future.
  call rt%submit(CHI_ROUTE_CPU, CHI_METHOD_ECHO, bytes_in, fut)
  call rt%submit(CHI_ROUTE_CPU, CHI_METHOD_ECHO, bytes_in, fut2)
  call expect(fut /= fut2, "two live futures differ")
  call rt%release(fut)
  call rt%wait(fut, stat=stat)
  call expect_stat(stat, CHI_ERR_INVALID, "wait on a released future")
  call rt%wait(fut2)

  ! A bind(C) derived type through submit_buffer, and the c_ptr forms.
  sample = sample_t(77_c_int64_t, 2.5_c_double, [1, 2, 3])
  call rt%submit_buffer(CHI_ROUTE_CPU, CHI_METHOD_ECHO, sample, c_sizeof(sample), fut)
  call rt%wait(fut, c_loc(sample_back), c_sizeof(sample_back), output_size=nbytes)
  call expect(nbytes == c_sizeof(sample), "echo of a derived type: size")
  call expect(sample_back%id == 77 .and. sample_back%value == 2.5_c_double .and. &
              all(sample_back%flags == [1, 2, 3]), "echo of a derived type")
  call rt%submit(CHI_ROUTE_CPU, CHI_METHOD_ECHO, c_null_ptr, 0_c_size_t, fut)
  call rt%wait(fut, output_size=nbytes)
  call expect(nbytes == 0, "echo of nothing")

  ! Registered host memory.
  host = [(real(i, c_double), i = 1, 64)]
  call rt%register_mem(CHI_ROUTE_CPU, c_loc(host), c_sizeof(host), region)
  call expect(region /= 0, "a region id is never 0")
  ref = chi_mem_ref_t(region, 8_c_int64_t * 10, 8_c_int64_t * 4)
  call rt%mem_resolve(ref, resolved, where_gpu)
  call expect(c_associated(resolved, c_loc(host(11))), "mem_resolve address")
  call expect(where_gpu == CHI_ROUTE_CPU, "mem_resolve location")
  ref = chi_mem_ref_t(region, 8_c_int64_t * 60, 8_c_int64_t * 5)
  call rt%mem_resolve(ref, resolved, stat=stat)
  call expect_stat(stat, CHI_ERR_INVALID, "mem_resolve past the region's end")
  call rt%unregister_mem(region)
  ref = chi_mem_ref_t(region, 0_c_int64_t, 8_c_int64_t)
  call rt%mem_resolve(ref, resolved, stat=stat)
  call expect_stat(stat, CHI_ERR_INVALID, "mem_resolve of an unregistered region")
  call rt%unregister_mem(region, stat)
  call expect_stat(stat, CHI_ERR_INVALID, "unregister twice")

  call rt%load_module("/nonexistent/libnothing.so", stat)
  call expect_stat(stat, CHI_ERR_NOT_FOUND, "load_module of a missing file")

  call rt%destroy()
  call expect(.not. rt%is_running(), "destroy stops the runtime")
  call rt%destroy()
  call rt%submit(CHI_ROUTE_CPU, CHI_METHOD_ECHO, bytes_in, fut, stat)
  call expect_stat(stat, CHI_ERR_INVALID, "submit after destroy")

  ! The object can start a new runtime after destroy.
  call rt%init(num_workers=1, gpus=0)
  call rt%submit(CHI_ROUTE_CPU, CHI_METHOD_ADD, [1_c_int64_t, 1_c_int64_t], fut)
  call rt%wait(fut, sum_out)
  call expect(sum_out(1) == 2, "chi.add on a second runtime")
  call rt%finalize()

  ! attach refuses a null handle; the final procedure finalizes a running
  ! runtime when its variable is deallocated (a leak under ASan otherwise).
  call rt%attach(c_null_ptr, stat)
  call expect_stat(stat, CHI_ERR_INVALID, "attach to a null handle")
  allocate(dynamic)
  call dynamic%init(num_workers=1, gpus=0)
  call dynamic%submit(CHI_ROUTE_CPU, CHI_METHOD_ECHO, bytes_in, fut)
  deallocate(dynamic)

  print '(a)', "fortran_basic: all checks passed"

contains

  ! The bind(C) mirrors have the C structs' sizes and field offsets.
  subroutine check_layout()
    integer(c_int64_t) :: c(32), f(27)
    type(chi_config_t), target :: cfg
    type(chi_request_t), target :: req
    type(chi_mem_ref_t), target :: mref
    type(chi_dev_context_t), target :: ctx
    type(chi_gpu_launch_t), target :: launch
    type(chi_gpu_orchestrator_t), target :: orch
    integer :: n, k

    n = ftest_layout(c, size(c))
    call expect(n == size(f), "ftest_layout count")
    f = [c_sizeof(cfg), &
         address(c_loc(cfg%config_path)) - address(c_loc(cfg)), &
         address(c_loc(cfg%mode)) - address(c_loc(cfg)), &
         address(c_loc(cfg%server_address)) - address(c_loc(cfg)), &
         address(c_loc(cfg%num_workers)) - address(c_loc(cfg)), &
         address(c_loc(cfg%gpus)) - address(c_loc(cfg)), &
         c_sizeof(req), &
         address(c_loc(req%source)) - address(c_loc(req)), &
         address(c_loc(req%input)) - address(c_loc(req)), &
         address(c_loc(req%input_size)) - address(c_loc(req)), &
         address(c_loc(req%output)) - address(c_loc(req)), &
         address(c_loc(req%output_capacity)) - address(c_loc(req)), &
         address(c_loc(req%output_size)) - address(c_loc(req)), &
         c_sizeof(mref), &
         address(c_loc(mref%offset)) - address(c_loc(mref)), &
         address(c_loc(mref%length)) - address(c_loc(mref)), &
         c_sizeof(ctx), &
         c_sizeof(launch), &
         address(c_loc(launch%gpu)) - address(c_loc(launch)), &
         address(c_loc(launch%stream)) - address(c_loc(launch)), &
         address(c_loc(launch%blocks)) - address(c_loc(launch)), &
         address(c_loc(launch%threads_per_block)) - address(c_loc(launch)), &
         address(c_loc(launch%state)) - address(c_loc(launch)), &
         c_sizeof(orch), &
         address(c_loc(orch%launch)) - address(c_loc(orch)), &
         address(c_loc(orch%method_names)) - address(c_loc(orch)), &
         address(c_loc(orch%method_count)) - address(c_loc(orch))]
    do k = 1, size(f)
      if (f(k) /= c(k)) then
        print '("layout entry ",i0,": Fortran ",i0,", C ",i0)', k, f(k), c(k)
        error stop "FAILED: a bind(C) mirror differs from the C struct"
      end if
    end do
  end subroutine check_layout
end program fortran_basic
