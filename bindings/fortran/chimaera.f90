! chimaera -- idiomatic Fortran interface to the chimaera task runtime.
!
! type(chi_runtime) owns one runtime; its type-bound procedures wrap the C API
! of chimaera.h.  Every procedure takes an optional `stat`: when present it
! receives the status (CHI_OK or a CHI_ERR_* code, or a handler's own code);
! when absent, any status other than CHI_OK stops the program with
! `error stop` and the library's message.
!
! Everything public in module chimaera_c (constants, struct mirrors, raw
! interfaces) is re-exported, so `use chimaera` is enough.
!
! Threads: the runtime calls handlers from its worker threads, several at
! once, so handlers must be `recursive` (locals on the stack) and must not
! touch unsynchronized shared state.  Every procedure here is recursive and
! may be called from handlers.
module chimaera
  use, intrinsic :: iso_c_binding, only: c_ptr, c_funptr, c_null_ptr, c_char, c_null_char, &
                                         c_int, c_int8_t, c_int32_t, c_int64_t, c_size_t, &
                                         c_intptr_t, c_float, c_double, c_loc, c_funloc, &
                                         c_f_pointer, c_associated
  use chimaera_c
  implicit none
  private :: c_ptr, c_funptr, c_null_ptr, c_char, c_null_char, c_int, c_int8_t, c_int32_t, &
             c_int64_t, c_size_t, c_intptr_t, c_float, c_double, c_loc, c_funloc, &
             c_f_pointer, c_associated

  ! A chimaera runtime.  Start it with init (or adopt a C handle with attach)
  ! and stop it with destroy (finalize is the same).  The final procedure
  ! finalizes a runtime still running when the variable goes away, on
  ! compilers that finalize it (gfortran before 13 does not finalize local
  ! variables); call destroy explicitly.  A running chi_runtime cannot be
  ! copied by assignment: pass it by reference, or by c_loc as user data.
  type :: chi_runtime
    private
    type(c_ptr) :: handle = c_null_ptr
    logical :: owned = .false.
  contains
    procedure :: init => runtime_init
    procedure :: attach => runtime_attach
    procedure :: finalize => runtime_destroy
    procedure :: destroy => runtime_destroy
    procedure :: is_running => runtime_is_running
    procedure :: c_handle => runtime_c_handle
    procedure :: register_handler => runtime_register_handler
    procedure :: lookup => runtime_lookup
    procedure, private :: submit_ptr, submit_i8, submit_i32, submit_i64, submit_r32, submit_r64
    generic :: submit => submit_ptr, submit_i8, submit_i32, submit_i64, submit_r32, submit_r64
    procedure :: submit_buffer => runtime_submit_buffer
    procedure, private :: wait_none, wait_ptr, wait_i8, wait_i32, wait_i64, wait_r32, wait_r64
    generic :: wait => wait_none, wait_ptr, wait_i8, wait_i32, wait_i64, wait_r32, wait_r64
    procedure :: submit_batch => runtime_submit_batch
    procedure :: wait_batch => runtime_wait_batch
    procedure :: test => runtime_test
    procedure :: release => runtime_release
    procedure :: load_module => runtime_load_module
    procedure :: register_mem => runtime_register_mem
    procedure :: unregister_mem => runtime_unregister_mem
    procedure :: mem_resolve => runtime_mem_resolve
    procedure :: gpu_count => runtime_gpu_count
    procedure :: gpu_context => runtime_gpu_context
    procedure :: gpu_pause => runtime_gpu_pause
    procedure :: gpu_resume => runtime_gpu_resume
    procedure, private :: runtime_assign
    generic :: assignment(=) => runtime_assign
    final :: runtime_final
  end type chi_runtime

  ! Handler helpers: view a request's input or output buffer as a Fortran
  ! array pointer of a given type (chi_request_input, chi_request_output), or
  ! copy an array into the output (chi_request_set_output).
  interface chi_request_input
    module procedure input_i8, input_i32, input_i64, input_r32, input_r64
  end interface chi_request_input
  interface chi_request_output
    module procedure output_i8, output_i32, output_i64, output_r32, output_r64
  end interface chi_request_output
  interface chi_request_set_output
    module procedure set_output_ptr, set_output_i8, set_output_i32, set_output_i64, &
                     set_output_r32, set_output_r64
  end interface chi_request_set_output

  ! libc, for C strings and byte copies.
  interface
    function c_strlen(s) bind(C, name="strlen") result(n)
      import :: c_ptr, c_size_t
      type(c_ptr), value :: s
      integer(c_size_t) :: n
    end function c_strlen
    function c_memcpy(dst, src, n) bind(C, name="memcpy") result(p)
      import :: c_ptr, c_size_t
      type(c_ptr), value :: dst, src
      integer(c_size_t), value :: n
      type(c_ptr) :: p
    end function c_memcpy
  end interface
  private :: c_strlen, c_memcpy

  ! Zero-size targets for views of empty buffers.
  integer(c_int8_t), target :: empty_i8(0)
  integer(c_int32_t), target :: empty_i32(0)
  integer(c_int64_t), target :: empty_i64(0)
  real(c_float), target :: empty_r32(0)
  real(c_double), target :: empty_r64(0)
  private :: empty_i8, empty_i32, empty_i64, empty_r32, empty_r64

  private :: runtime_init, runtime_attach, runtime_destroy, runtime_is_running, &
             runtime_c_handle, runtime_register_handler, runtime_lookup, &
             submit_ptr, submit_i8, submit_i32, submit_i64, submit_r32, submit_r64, &
             runtime_submit_buffer, wait_none, wait_ptr, wait_i8, wait_i32, wait_i64, &
             wait_r32, wait_r64, runtime_submit_batch, runtime_wait_batch, &
             runtime_test, runtime_release, runtime_load_module, &
             runtime_register_mem, runtime_unregister_mem, runtime_mem_resolve, &
             runtime_gpu_count, runtime_gpu_context, runtime_gpu_pause, runtime_gpu_resume, &
             runtime_assign, runtime_final, &
             input_i8, input_i32, input_i64, input_r32, input_r64, &
             output_i8, output_i32, output_i64, output_r32, output_r64, &
             set_output_ptr, set_output_i8, set_output_i32, set_output_i64, &
             set_output_r32, set_output_r64, &
             check, fail, timeout_value, array_address, array_bytes, view_elements

contains

  ! ------------------------------------------------------------- strings

  ! A Fortran string from a NUL-terminated C string ('' for c_null_ptr).
  recursive function chi_f_string(cstr) result(str)
    type(c_ptr), intent(in) :: cstr
    character(len=:), allocatable :: str
    character(kind=c_char), pointer :: chars(:)
    integer(c_size_t) :: n, i

    if (.not. c_associated(cstr)) then
      str = ''
      return
    end if
    n = c_strlen(cstr)
    allocate(character(len=n) :: str)
    if (n == 0) return
    call c_f_pointer(cstr, chars, [n])
    do i = 1, n
      str(i:i) = chars(i)
    end do
  end function chi_f_string

  ! A NUL-terminated C string from a Fortran string (trailing blanks dropped).
  pure function chi_c_string(str) result(cstr)
    character(len=*), intent(in) :: str
    character(kind=c_char, len=:), allocatable :: cstr
    cstr = trim(str) // c_null_char
  end function chi_c_string

  ! chi_status_string as a Fortran string.
  recursive function chi_status_text(status) result(str)
    integer(c_int32_t), intent(in) :: status
    character(len=:), allocatable :: str
    str = chi_f_string(chi_status_string(status))
  end function chi_status_text

  ! This thread's chi_last_error_message as a Fortran string.  Read it right
  ! after the failing call: any later chi_* call may replace it.
  recursive function chi_last_error() result(str)
    character(len=:), allocatable :: str
    str = chi_f_string(chi_last_error_message())
  end function chi_last_error

  ! chi_version_string as a Fortran string ("MAJOR.MINOR.PATCH").
  recursive function chi_version_text() result(str)
    character(len=:), allocatable :: str
    str = chi_f_string(chi_version_string())
  end function chi_version_text

  ! ------------------------------------------------------------- status

  ! Hands status to stat when present; otherwise stops on failure with
  ! detail, or else the library's message (for failures of a C call).
  recursive subroutine check(status, what, stat, detail)
    integer(c_int32_t), intent(in) :: status
    character(len=*), intent(in) :: what
    integer(c_int32_t), intent(out), optional :: stat
    character(len=*), intent(in), optional :: detail

    if (present(stat)) then
      stat = status
    else if (status /= CHI_OK) then
      if (present(detail)) then
        call fail(status, what, detail)
      else
        call fail(status, what, chi_last_error())
      end if
    end if
  end subroutine check

  recursive subroutine fail(status, what, detail)
    integer(c_int32_t), intent(in) :: status
    character(len=*), intent(in) :: what, detail
    character(len=16) :: code

    write (code, '(i0)') status
    if (len(detail) > 0) then
      error stop "chimaera: " // what // ": " // chi_status_text(status) // " (" // &
                 trim(code) // "): " // detail
    else
      error stop "chimaera: " // what // ": " // chi_status_text(status) // " (" // &
                 trim(code) // ")"
    end if
  end subroutine fail

  pure function timeout_value(timeout_ns) result(t)
    integer(c_int64_t), intent(in), optional :: timeout_ns
    integer(c_int64_t) :: t
    t = -1_c_int64_t
    if (present(timeout_ns)) t = timeout_ns
  end function timeout_value

  ! ------------------------------------------------------------- lifetime

  ! Starts a runtime.  Absent arguments keep chi_config_init's defaults (then
  ! the YAML file, CHI_* environment).  num_workers 0: from config; gpus -1:
  ! all visible, 0: none.  settings: any keys of the configuration file as
  ! YAML text, nested keys dotted, e.g.
  !   settings="{worker_stack_size: 64M, queue_depth: 262144, gpu.lease_us: 0}"
  ! (chi_config_t%settings: over the file and environment, under the other
  ! arguments).  Fails with CHI_ERR_INVALID if this object already holds a
  ! runtime (that failure sets no library message).
  recursive subroutine runtime_init(self, config_path, num_workers, gpus, mode, &
                                    server_address, stat, settings)
    class(chi_runtime), intent(inout) :: self
    character(len=*), intent(in), optional :: config_path
    integer(c_int32_t), intent(in), optional :: num_workers
    integer(c_int32_t), intent(in), optional :: gpus
    integer(c_int32_t), intent(in), optional :: mode
    character(len=*), intent(in), optional :: server_address
    integer(c_int32_t), intent(out), optional :: stat
    character(len=*), intent(in), optional :: settings
    type(chi_config_t), target :: cfg
    character(kind=c_char, len=:), allocatable, target :: path_c, address_c, settings_c
    type(c_ptr) :: handle
    integer(c_int32_t) :: status

    if (c_associated(self%handle)) then
      if (present(stat)) then
        stat = CHI_ERR_INVALID
        return
      end if
      call fail(CHI_ERR_INVALID, "init", "this chi_runtime is already running")
    end if
    call chi_config_init(cfg)
    if (present(config_path)) then
      path_c = chi_c_string(config_path)
      cfg%config_path = c_loc(path_c)
    end if
    if (present(server_address)) then
      address_c = chi_c_string(server_address)
      cfg%server_address = c_loc(address_c)
    end if
    if (present(settings)) then
      settings_c = chi_c_string(settings)
      cfg%settings = c_loc(settings_c)
    end if
    if (present(num_workers)) cfg%num_workers = num_workers
    if (present(gpus)) cfg%gpus = gpus
    if (present(mode)) cfg%mode = mode
    status = chi_init(c_loc(cfg), handle)
    if (status == CHI_OK) then
      self%handle = handle
      self%owned = .true.
    end if
    call check(status, "chi_init", stat)
  end subroutine runtime_init

  ! Wraps a runtime started elsewhere (a C caller, or the rt argument of a
  ! chimaera_module_init written in Fortran) without taking ownership:
  ! destroy then only forgets it.
  recursive subroutine runtime_attach(self, handle, stat)
    class(chi_runtime), intent(inout) :: self
    type(c_ptr), intent(in) :: handle
    integer(c_int32_t), intent(out), optional :: stat

    if (c_associated(self%handle) .or. .not. c_associated(handle)) then
      if (present(stat)) then
        stat = CHI_ERR_INVALID
        return
      end if
      call fail(CHI_ERR_INVALID, "attach", "the handle is null or this chi_runtime is running")
    end if
    self%handle = handle
    self%owned = .false.
    if (present(stat)) stat = CHI_OK
  end subroutine runtime_attach

  ! Stops the runtime (chi_finalize: queued tasks run to completion, threads
  ! are joined, outstanding futures freed), or forgets an attached one.
  ! A no-op on a chi_runtime that is not running.  Not from a handler.
  recursive subroutine runtime_destroy(self, stat)
    class(chi_runtime), intent(inout) :: self
    integer(c_int32_t), intent(out), optional :: stat
    integer(c_int32_t) :: status

    status = CHI_OK
    if (self%owned) status = chi_finalize(self%handle)
    if (status == CHI_OK) then
      self%handle = c_null_ptr
      self%owned = .false.
    end if
    call check(status, "chi_finalize", stat)
  end subroutine runtime_destroy

  pure logical function runtime_is_running(self)
    class(chi_runtime), intent(in) :: self
    runtime_is_running = c_associated(self%handle)
  end function runtime_is_running

  ! The chi_runtime_t * for the raw interfaces of module chimaera_c.
  pure function runtime_c_handle(self) result(handle)
    class(chi_runtime), intent(in) :: self
    type(c_ptr) :: handle
    handle = self%handle
  end function runtime_c_handle

  subroutine runtime_final(self)
    type(chi_runtime), intent(inout) :: self
    integer(c_int32_t) :: status

    if (self%owned .and. c_associated(self%handle)) status = chi_finalize(self%handle)
    self%handle = c_null_ptr
    self%owned = .false.
  end subroutine runtime_final

  ! Two objects owning one runtime would finalize it twice.
  recursive subroutine runtime_assign(lhs, rhs)
    class(chi_runtime), intent(inout) :: lhs
    class(chi_runtime), intent(in) :: rhs

    if (c_associated(lhs%handle) .or. c_associated(rhs%handle)) then
      error stop "chimaera: a running chi_runtime cannot be copied; pass it by reference"
    end if
  end subroutine runtime_assign

  ! ------------------------------------------------------------- methods

  ! Registers a CPU handler under a unique name (1..127 printable ASCII).
  ! proc: a bind(C), recursive procedure with the chi_handler_t interface.
  ! user_data: passed to every call (e.g. c_loc of a target variable).
  recursive subroutine runtime_register_handler(self, name, proc, user_data, method, stat)
    class(chi_runtime), intent(in) :: self
    character(len=*), intent(in) :: name
    procedure(chi_handler_t) :: proc
    type(c_ptr), intent(in), optional :: user_data
    integer(c_int32_t), intent(out), optional :: method
    integer(c_int32_t), intent(out), optional :: stat
    integer(c_int32_t), target :: id
    type(c_ptr) :: data
    integer(c_int32_t) :: status

    id = 0
    data = c_null_ptr
    if (present(user_data)) data = user_data
    status = chi_register_handler(self%handle, chi_c_string(name), c_funloc(proc), data, &
                                  c_loc(id))
    if (present(method)) method = id
    call check(status, "chi_register_handler", stat)
  end subroutine runtime_register_handler

  ! The id of a method by name (CHI_ERR_NOT_FOUND if none).
  recursive subroutine runtime_lookup(self, name, method, stat)
    class(chi_runtime), intent(in) :: self
    character(len=*), intent(in) :: name
    integer(c_int32_t), intent(out) :: method
    integer(c_int32_t), intent(out), optional :: stat
    integer(c_int32_t) :: status

    method = 0
    status = chi_method_lookup(self%handle, chi_c_string(name), method)
    call check(status, "chi_method_lookup", stat)
  end subroutine runtime_lookup

  ! ------------------------------------------------------------- submit

  ! submit(route, method, input, future [, stat]): input is a rank-1 array of
  ! int8, int32, int64, real32 or real64 (its bytes are the payload), or
  ! submit(route, method, input_ptr, input_size, future [, stat]) with a
  ! c_ptr and a byte count.  The input is copied before the call returns.
  recursive subroutine submit_ptr(self, route, method, input, input_size, future, stat)
    class(chi_runtime), intent(in) :: self
    integer(c_int32_t), intent(in) :: route, method
    type(c_ptr), intent(in) :: input
    integer(c_size_t), intent(in) :: input_size
    integer(c_int64_t), intent(out) :: future
    integer(c_int32_t), intent(out), optional :: stat
    integer(c_int32_t) :: status

    future = 0
    status = chi_submit(self%handle, route, method, input, input_size, future)
    call check(status, "chi_submit", stat)
  end subroutine submit_ptr

  recursive subroutine submit_i8(self, route, method, input, future, stat)
    class(chi_runtime), intent(in) :: self
    integer(c_int32_t), intent(in) :: route, method
    integer(c_int8_t), intent(in), target, contiguous :: input(:)
    integer(c_int64_t), intent(out) :: future
    integer(c_int32_t), intent(out), optional :: stat
    type(c_ptr) :: p

    p = c_null_ptr
    if (size(input) > 0) p = c_loc(input)
    call submit_ptr(self, route, method, p, array_bytes(size(input), storage_size(input)), &
                    future, stat)
  end subroutine submit_i8

  recursive subroutine submit_i32(self, route, method, input, future, stat)
    class(chi_runtime), intent(in) :: self
    integer(c_int32_t), intent(in) :: route, method
    integer(c_int32_t), intent(in), target, contiguous :: input(:)
    integer(c_int64_t), intent(out) :: future
    integer(c_int32_t), intent(out), optional :: stat
    type(c_ptr) :: p

    p = c_null_ptr
    if (size(input) > 0) p = c_loc(input)
    call submit_ptr(self, route, method, p, array_bytes(size(input), storage_size(input)), &
                    future, stat)
  end subroutine submit_i32

  recursive subroutine submit_i64(self, route, method, input, future, stat)
    class(chi_runtime), intent(in) :: self
    integer(c_int32_t), intent(in) :: route, method
    integer(c_int64_t), intent(in), target, contiguous :: input(:)
    integer(c_int64_t), intent(out) :: future
    integer(c_int32_t), intent(out), optional :: stat
    type(c_ptr) :: p

    p = c_null_ptr
    if (size(input) > 0) p = c_loc(input)
    call submit_ptr(self, route, method, p, array_bytes(size(input), storage_size(input)), &
                    future, stat)
  end subroutine submit_i64

  recursive subroutine submit_r32(self, route, method, input, future, stat)
    class(chi_runtime), intent(in) :: self
    integer(c_int32_t), intent(in) :: route, method
    real(c_float), intent(in), target, contiguous :: input(:)
    integer(c_int64_t), intent(out) :: future
    integer(c_int32_t), intent(out), optional :: stat
    type(c_ptr) :: p

    p = c_null_ptr
    if (size(input) > 0) p = c_loc(input)
    call submit_ptr(self, route, method, p, array_bytes(size(input), storage_size(input)), &
                    future, stat)
  end subroutine submit_r32

  recursive subroutine submit_r64(self, route, method, input, future, stat)
    class(chi_runtime), intent(in) :: self
    integer(c_int32_t), intent(in) :: route, method
    real(c_double), intent(in), target, contiguous :: input(:)
    integer(c_int64_t), intent(out) :: future
    integer(c_int32_t), intent(out), optional :: stat
    type(c_ptr) :: p

    p = c_null_ptr
    if (size(input) > 0) p = c_loc(input)
    call submit_ptr(self, route, method, p, array_bytes(size(input), storage_size(input)), &
                    future, stat)
  end subroutine submit_r64

  ! Submits the first input_size bytes of any variable: a scalar (say, a
  ! bind(C) derived type: input_size = c_sizeof(x)) or an array of any rank.
  ! A non-contiguous array is passed as a contiguous copy.
  recursive subroutine runtime_submit_buffer(self, route, method, input, input_size, future, stat)
    class(chi_runtime), intent(in) :: self
    integer(c_int32_t), intent(in) :: route, method
    type(*), dimension(..), intent(in), target, contiguous :: input
    integer(c_size_t), intent(in) :: input_size
    integer(c_int64_t), intent(out) :: future
    integer(c_int32_t), intent(out), optional :: stat

    call submit_ptr(self, route, method, array_address(input), input_size, future, stat)
  end subroutine runtime_submit_buffer

  recursive function array_address(x) result(p)
    type(*), dimension(..), intent(in), target, contiguous :: x
    type(c_ptr) :: p

    p = c_null_ptr
    if (rank(x) == 0) then
      p = c_loc(x)
    else if (size(x) > 0) then
      p = c_loc(x)
    end if
  end function array_address

  pure function array_bytes(n, bits) result(bytes)
    integer, intent(in) :: n, bits
    integer(c_size_t) :: bytes
    bytes = int(n, c_size_t) * int(bits / 8, c_size_t)
  end function array_bytes

  ! ------------------------------------------------------------- wait

  ! wait(future [, output] [, output_size] [, timeout_ns] [, stat]) takes a
  ! task's result and consumes the future.  output: a rank-1 array of int8,
  ! int32, int64, real32 or real64 receiving the result's bytes, or a c_ptr
  ! followed by its capacity in bytes; absent: the result is discarded.
  ! output_size receives the result's size in bytes (or the size needed, with
  ! CHI_ERR_TOO_LARGE).  timeout_ns: absent or < 0 waits forever, 0 polls.
  ! The status is the handler's own when the task ran; CHI_ERR_TIMEOUT and
  ! CHI_ERR_TOO_LARGE leave the future valid.
  recursive subroutine wait_ptr(self, future, output, output_capacity, output_size, &
                                timeout_ns, stat)
    class(chi_runtime), intent(in) :: self
    integer(c_int64_t), intent(in) :: future
    type(c_ptr), intent(in) :: output
    integer(c_size_t), intent(in) :: output_capacity
    integer(c_size_t), intent(out), optional :: output_size
    integer(c_int64_t), intent(in), optional :: timeout_ns
    integer(c_int32_t), intent(out), optional :: stat
    integer(c_size_t), target :: got
    integer(c_int32_t) :: status

    got = 0
    status = chi_wait(self%handle, future, timeout_value(timeout_ns), output, output_capacity, &
                      c_loc(got))
    if (present(output_size)) output_size = got
    call check(status, "chi_wait", stat)
  end subroutine wait_ptr

  recursive subroutine wait_none(self, future, output_size, timeout_ns, stat)
    class(chi_runtime), intent(in) :: self
    integer(c_int64_t), intent(in) :: future
    integer(c_size_t), intent(out), optional :: output_size
    integer(c_int64_t), intent(in), optional :: timeout_ns
    integer(c_int32_t), intent(out), optional :: stat

    call wait_ptr(self, future, c_null_ptr, 0_c_size_t, output_size, timeout_ns, stat)
  end subroutine wait_none

  recursive subroutine wait_i8(self, future, output, output_size, timeout_ns, stat)
    class(chi_runtime), intent(in) :: self
    integer(c_int64_t), intent(in) :: future
    integer(c_int8_t), intent(inout), target, contiguous :: output(:)
    integer(c_size_t), intent(out), optional :: output_size
    integer(c_int64_t), intent(in), optional :: timeout_ns
    integer(c_int32_t), intent(out), optional :: stat
    integer(c_int8_t), target :: dummy(1)

    if (size(output) > 0) then
      call wait_ptr(self, future, c_loc(output), array_bytes(size(output), &
                    storage_size(output)), output_size, timeout_ns, stat)
    else
      call wait_ptr(self, future, c_loc(dummy), 0_c_size_t, output_size, timeout_ns, stat)
    end if
  end subroutine wait_i8

  recursive subroutine wait_i32(self, future, output, output_size, timeout_ns, stat)
    class(chi_runtime), intent(in) :: self
    integer(c_int64_t), intent(in) :: future
    integer(c_int32_t), intent(inout), target, contiguous :: output(:)
    integer(c_size_t), intent(out), optional :: output_size
    integer(c_int64_t), intent(in), optional :: timeout_ns
    integer(c_int32_t), intent(out), optional :: stat
    integer(c_int8_t), target :: dummy(1)

    if (size(output) > 0) then
      call wait_ptr(self, future, c_loc(output), array_bytes(size(output), &
                    storage_size(output)), output_size, timeout_ns, stat)
    else
      call wait_ptr(self, future, c_loc(dummy), 0_c_size_t, output_size, timeout_ns, stat)
    end if
  end subroutine wait_i32

  recursive subroutine wait_i64(self, future, output, output_size, timeout_ns, stat)
    class(chi_runtime), intent(in) :: self
    integer(c_int64_t), intent(in) :: future
    integer(c_int64_t), intent(inout), target, contiguous :: output(:)
    integer(c_size_t), intent(out), optional :: output_size
    integer(c_int64_t), intent(in), optional :: timeout_ns
    integer(c_int32_t), intent(out), optional :: stat
    integer(c_int8_t), target :: dummy(1)

    if (size(output) > 0) then
      call wait_ptr(self, future, c_loc(output), array_bytes(size(output), &
                    storage_size(output)), output_size, timeout_ns, stat)
    else
      call wait_ptr(self, future, c_loc(dummy), 0_c_size_t, output_size, timeout_ns, stat)
    end if
  end subroutine wait_i64

  recursive subroutine wait_r32(self, future, output, output_size, timeout_ns, stat)
    class(chi_runtime), intent(in) :: self
    integer(c_int64_t), intent(in) :: future
    real(c_float), intent(inout), target, contiguous :: output(:)
    integer(c_size_t), intent(out), optional :: output_size
    integer(c_int64_t), intent(in), optional :: timeout_ns
    integer(c_int32_t), intent(out), optional :: stat
    integer(c_int8_t), target :: dummy(1)

    if (size(output) > 0) then
      call wait_ptr(self, future, c_loc(output), array_bytes(size(output), &
                    storage_size(output)), output_size, timeout_ns, stat)
    else
      call wait_ptr(self, future, c_loc(dummy), 0_c_size_t, output_size, timeout_ns, stat)
    end if
  end subroutine wait_r32

  recursive subroutine wait_r64(self, future, output, output_size, timeout_ns, stat)
    class(chi_runtime), intent(in) :: self
    integer(c_int64_t), intent(in) :: future
    real(c_double), intent(inout), target, contiguous :: output(:)
    integer(c_size_t), intent(out), optional :: output_size
    integer(c_int64_t), intent(in), optional :: timeout_ns
    integer(c_int32_t), intent(out), optional :: stat
    integer(c_int8_t), target :: dummy(1)

    if (size(output) > 0) then
      call wait_ptr(self, future, c_loc(output), array_bytes(size(output), &
                    storage_size(output)), output_size, timeout_ns, stat)
    else
      call wait_ptr(self, future, c_loc(dummy), 0_c_size_t, output_size, timeout_ns, stat)
    end if
  end subroutine wait_r64

  ! ------------------------------------------------------------- batches

  ! submit_batch(route, tasks, futures [, submitted] [, stat]) submits
  ! size(tasks) tasks on one route, in order (chi_submit_batch); futures(i)
  ! receives task i's future (futures needs size(tasks) elements).  Each
  ! task's input is copied before the call returns: point tasks(i)%input at
  ! a target variable, e.g. chi_task_desc_t(CHI_METHOD_ECHO, c_loc(x),
  ! c_sizeof(x)).  It stops at the first task that cannot be queued and
  ! gives that task's status: submitted receives the number queued (their
  ! futures are valid, wait on futures(1:submitted)), the later futures are
  ! 0 and those tasks never run.
  recursive subroutine runtime_submit_batch(self, route, tasks, futures, submitted, stat)
    class(chi_runtime), intent(in) :: self
    integer(c_int32_t), intent(in) :: route
    type(chi_task_desc_t), intent(in), contiguous :: tasks(:)
    integer(c_int64_t), intent(out), contiguous :: futures(:)
    integer(c_size_t), intent(out), optional :: submitted
    integer(c_int32_t), intent(out), optional :: stat
    integer(c_size_t), target :: sent
    integer(c_int32_t) :: status

    sent = 0
    futures = 0
    if (size(futures) < size(tasks)) then
      if (present(submitted)) submitted = 0
      call check(CHI_ERR_INVALID, "submit_batch", stat, "futures has fewer elements than tasks")
      return
    end if
    status = chi_submit_batch(self%handle, route, tasks, int(size(tasks), c_size_t), futures, &
                              c_loc(sent))
    if (present(submitted)) submitted = sent
    call check(status, "chi_submit_batch", stat)
  end subroutine runtime_submit_batch

  ! wait_batch(futures, results [, done] [, timeout_ns] [, stat]) takes the
  ! results of size(futures) tasks, in order (chi_wait_batch).  Set each
  ! results(i)%output and %output_capacity first (c_loc of a target buffer
  ! and its size in bytes, or c_null_ptr and 0 to discard the output);
  ! results(i) receives future i's output_size and status (the task's own:
  ! CHI_OK or its failure).  A task's failure does not stop the batch; stat
  ! is CHI_OK once every result was taken.  Otherwise stat says why it
  ! stopped at futures(done + 1): CHI_ERR_TIMEOUT (timeout_ns, absent or < 0
  ! forever, 0 poll, bounds the whole call), CHI_ERR_TOO_LARGE
  ! (results(done + 1)%output_size is the size needed), CHI_ERR_INVALID (a
  ! future 0, stale or of another runtime) or CHI_ERR_DISCONNECTED;
  ! futures(1:done) are consumed, futures(done + 1:) left as they were, to
  ! wait on again.
  recursive subroutine runtime_wait_batch(self, futures, results, done, timeout_ns, stat)
    class(chi_runtime), intent(in) :: self
    integer(c_int64_t), intent(in), contiguous :: futures(:)
    type(chi_task_result_t), intent(inout), contiguous :: results(:)
    integer(c_size_t), intent(out), optional :: done
    integer(c_int64_t), intent(in), optional :: timeout_ns
    integer(c_int32_t), intent(out), optional :: stat
    integer(c_size_t), target :: taken
    integer(c_int32_t) :: status

    taken = 0
    if (size(results) < size(futures)) then
      if (present(done)) done = 0
      call check(CHI_ERR_INVALID, "wait_batch", stat, "results has fewer elements than futures")
      return
    end if
    status = chi_wait_batch(self%handle, futures, int(size(futures), c_size_t), &
                            timeout_value(timeout_ns), results, c_loc(taken))
    if (present(done)) done = taken
    call check(status, "chi_wait_batch", stat)
  end subroutine runtime_wait_batch

  ! Whether a task has finished, without blocking; the future stays valid.
  recursive subroutine runtime_test(self, future, done, stat)
    class(chi_runtime), intent(in) :: self
    integer(c_int64_t), intent(in) :: future
    logical, intent(out) :: done
    integer(c_int32_t), intent(out), optional :: stat
    integer(c_int) :: flag
    integer(c_int32_t) :: status

    flag = 0
    status = chi_test(self%handle, future, flag)
    done = flag /= 0
    call check(status, "chi_test", stat)
  end subroutine runtime_test

  ! Drops interest in a task: it still runs, its result is discarded.
  recursive subroutine runtime_release(self, future, stat)
    class(chi_runtime), intent(in) :: self
    integer(c_int64_t), intent(in) :: future
    integer(c_int32_t), intent(out), optional :: stat

    call check(chi_release(self%handle, future), "chi_release", stat)
  end subroutine runtime_release

  ! Loads a shared object exporting chimaera_module_init.
  recursive subroutine runtime_load_module(self, path, stat)
    class(chi_runtime), intent(in) :: self
    character(len=*), intent(in) :: path
    integer(c_int32_t), intent(out), optional :: stat

    call check(chi_load_module(self%handle, chi_c_string(path)), "chi_load_module", stat)
  end subroutine runtime_load_module

  ! ------------------------------------------------------------- memory

  ! Registers size bytes at ptr (c_loc of a target array) as a region that
  ! tasks reference with chi_mem_ref_t.  gpu: CHI_ROUTE_CPU for host memory,
  ! or a GPU number for that GPU's device memory.  Keep the memory alive
  ! until unregister_mem.
  recursive subroutine runtime_register_mem(self, gpu, ptr, size, region, stat)
    class(chi_runtime), intent(in) :: self
    integer(c_int32_t), intent(in) :: gpu
    type(c_ptr), intent(in) :: ptr
    integer(c_size_t), intent(in) :: size
    integer(c_int64_t), intent(out) :: region
    integer(c_int32_t), intent(out), optional :: stat

    region = 0
    call check(chi_register_gpu_mem(self%handle, gpu, ptr, size, region), &
               "chi_register_gpu_mem", stat)
  end subroutine runtime_register_mem

  recursive subroutine runtime_unregister_mem(self, region, stat)
    class(chi_runtime), intent(in) :: self
    integer(c_int64_t), intent(in) :: region
    integer(c_int32_t), intent(out), optional :: stat

    call check(chi_unregister_mem(self%handle, region), "chi_unregister_mem", stat)
  end subroutine runtime_unregister_mem

  ! For a CPU handler: the address a reference names, after a bounds check;
  ! gpu receives where it lives (CHI_ROUTE_CPU or a GPU number).  Turn the
  ! address into an array with c_f_pointer.
  recursive subroutine runtime_mem_resolve(self, ref, ptr, gpu, stat)
    class(chi_runtime), intent(in) :: self
    type(chi_mem_ref_t), intent(in) :: ref
    type(c_ptr), intent(out) :: ptr
    integer(c_int32_t), intent(out), optional :: gpu
    integer(c_int32_t), intent(out), optional :: stat
    integer(c_int32_t), target :: location

    ptr = c_null_ptr
    location = CHI_ROUTE_CPU
    call check(chi_mem_resolve(self%handle, ref, ptr, c_loc(location)), "chi_mem_resolve", stat)
    if (present(gpu)) gpu = location
  end subroutine runtime_mem_resolve

  ! ------------------------------------------------------------- GPU

  ! Number of GPUs this runtime drives (0 without GPU support or GPU).
  recursive function runtime_gpu_count(self, stat) result(count)
    class(chi_runtime), intent(in) :: self
    integer(c_int32_t), intent(out), optional :: stat
    integer(c_int32_t) :: count

    count = 0
    call check(chi_gpu_count(self%handle, count), "chi_gpu_count", stat)
  end function runtime_gpu_count

  ! The device context of GPU gpu, for kernels written in CUDA/HIP: pass ctx
  ! to a bind(C) launcher of your own (type(chi_dev_context_t), intent(in):
  ! a const chi_dev_context_t * in C), which hands it to the kernel by value.
  ! Valid until destroy; the kernels must have finished by then.  In a client
  ! (mode=CHI_MODE_CLIENT) it is the relay context of this process's kernels
  ! on the server's GPU gpu, the client's CUDA device of that number: their
  ! submits go to the server, CHI_ROUTE_CPU also to this runtime's own
  ! handlers (source = gpu).  The first call for a GPU starts the relay:
  ! make it before launching the kernels.  stat: CHI_ERR_INVALID (gpu >=
  ! gpu_count()), CHI_ERR_NO_DEVICE (no such GPU; in a client: the server
  ! drives none, or this process sees no CUDA device gpu).
  recursive subroutine runtime_gpu_context(self, gpu, ctx, stat)
    class(chi_runtime), intent(in) :: self
    integer(c_int32_t), intent(in) :: gpu
    type(chi_dev_context_t), intent(out) :: ctx
    integer(c_int32_t), intent(out), optional :: stat

    call check(chi_gpu_context(self%handle, gpu, ctx), "chi_gpu_context", stat)
  end subroutine runtime_gpu_context

  ! Stops GPU gpu's orchestrator (-1: every GPU) until gpu_resume, so that
  ! device-wide synchronization can run.
  recursive subroutine runtime_gpu_pause(self, gpu, stat)
    class(chi_runtime), intent(in) :: self
    integer(c_int32_t), intent(in) :: gpu
    integer(c_int32_t), intent(out), optional :: stat

    call check(chi_gpu_pause(self%handle, gpu), "chi_gpu_pause", stat)
  end subroutine runtime_gpu_pause

  recursive subroutine runtime_gpu_resume(self, gpu, stat)
    class(chi_runtime), intent(in) :: self
    integer(c_int32_t), intent(in) :: gpu
    integer(c_int32_t), intent(out), optional :: stat

    call check(chi_gpu_resume(self%handle, gpu), "chi_gpu_resume", stat)
  end subroutine runtime_gpu_resume

  ! ------------------------------------------------------------- handler helpers

  ! Elements of `bytes` bytes at p that a view of elem-byte elements covers:
  ! CHI_ERR_INVALID when p is misaligned for the type, or (exact) when the
  ! size is not a whole number of elements.
  recursive function view_elements(p, bytes, elem, exact, n) result(status)
    type(c_ptr), intent(in) :: p
    integer(c_size_t), intent(in) :: bytes
    integer, intent(in) :: elem
    logical, intent(in) :: exact
    integer(c_size_t), intent(out) :: n
    integer(c_int32_t) :: status

    n = 0
    status = CHI_OK
    if (bytes == 0 .or. .not. c_associated(p)) return
    if (exact .and. mod(bytes, int(elem, c_size_t)) /= 0) then
      status = CHI_ERR_INVALID
    else if (mod(transfer(p, 0_c_intptr_t), int(elem, c_intptr_t)) /= 0) then
      status = CHI_ERR_INVALID
    else
      n = bytes / int(elem, c_size_t)
    end if
  end function view_elements

  ! chi_request_input(req, view [, stat]): points view at the task's input
  ! (read it only).  Fails with CHI_ERR_INVALID (view nullified) when the
  ! input size is not a whole number of elements or is misaligned; return
  ! that status from the handler.
  recursive subroutine input_i8(req, view, stat)
    type(chi_request_t), intent(in) :: req
    integer(c_int8_t), pointer, intent(out) :: view(:)
    integer(c_int32_t), intent(out), optional :: stat
    integer(c_size_t) :: n
    integer(c_int32_t) :: status

    status = view_elements(req%input, req%input_size, 1, .true., n)
    view => empty_i8
    if (status /= CHI_OK) nullify(view)
    if (n > 0) call c_f_pointer(req%input, view, [n])
    call check(status, "chi_request_input", stat, &
                "input size not a whole number of elements, or input misaligned")
  end subroutine input_i8

  recursive subroutine input_i32(req, view, stat)
    type(chi_request_t), intent(in) :: req
    integer(c_int32_t), pointer, intent(out) :: view(:)
    integer(c_int32_t), intent(out), optional :: stat
    integer(c_size_t) :: n
    integer(c_int32_t) :: status

    status = view_elements(req%input, req%input_size, 4, .true., n)
    view => empty_i32
    if (status /= CHI_OK) nullify(view)
    if (n > 0) call c_f_pointer(req%input, view, [n])
    call check(status, "chi_request_input", stat, &
                "input size not a whole number of elements, or input misaligned")
  end subroutine input_i32

  recursive subroutine input_i64(req, view, stat)
    type(chi_request_t), intent(in) :: req
    integer(c_int64_t), pointer, intent(out) :: view(:)
    integer(c_int32_t), intent(out), optional :: stat
    integer(c_size_t) :: n
    integer(c_int32_t) :: status

    status = view_elements(req%input, req%input_size, 8, .true., n)
    view => empty_i64
    if (status /= CHI_OK) nullify(view)
    if (n > 0) call c_f_pointer(req%input, view, [n])
    call check(status, "chi_request_input", stat, &
                "input size not a whole number of elements, or input misaligned")
  end subroutine input_i64

  recursive subroutine input_r32(req, view, stat)
    type(chi_request_t), intent(in) :: req
    real(c_float), pointer, intent(out) :: view(:)
    integer(c_int32_t), intent(out), optional :: stat
    integer(c_size_t) :: n
    integer(c_int32_t) :: status

    status = view_elements(req%input, req%input_size, 4, .true., n)
    view => empty_r32
    if (status /= CHI_OK) nullify(view)
    if (n > 0) call c_f_pointer(req%input, view, [n])
    call check(status, "chi_request_input", stat, &
                "input size not a whole number of elements, or input misaligned")
  end subroutine input_r32

  recursive subroutine input_r64(req, view, stat)
    type(chi_request_t), intent(in) :: req
    real(c_double), pointer, intent(out) :: view(:)
    integer(c_int32_t), intent(out), optional :: stat
    integer(c_size_t) :: n
    integer(c_int32_t) :: status

    status = view_elements(req%input, req%input_size, 8, .true., n)
    view => empty_r64
    if (status /= CHI_OK) nullify(view)
    if (n > 0) call c_f_pointer(req%input, view, [n])
    call check(status, "chi_request_input", stat, &
                "input size not a whole number of elements, or input misaligned")
  end subroutine input_r64

  ! chi_request_output(req, view [, stat]): points view at the whole output
  ! buffer (output_capacity bytes, rounded down to whole elements).  Write
  ! the result there and set req%output_size to its size in bytes.
  recursive subroutine output_i8(req, view, stat)
    type(chi_request_t), intent(in) :: req
    integer(c_int8_t), pointer, intent(out) :: view(:)
    integer(c_int32_t), intent(out), optional :: stat
    integer(c_size_t) :: n
    integer(c_int32_t) :: status

    status = view_elements(req%output, req%output_capacity, 1, .false., n)
    view => empty_i8
    if (status /= CHI_OK) nullify(view)
    if (n > 0) call c_f_pointer(req%output, view, [n])
    call check(status, "chi_request_output", stat, "output misaligned for the type")
  end subroutine output_i8

  recursive subroutine output_i32(req, view, stat)
    type(chi_request_t), intent(in) :: req
    integer(c_int32_t), pointer, intent(out) :: view(:)
    integer(c_int32_t), intent(out), optional :: stat
    integer(c_size_t) :: n
    integer(c_int32_t) :: status

    status = view_elements(req%output, req%output_capacity, 4, .false., n)
    view => empty_i32
    if (status /= CHI_OK) nullify(view)
    if (n > 0) call c_f_pointer(req%output, view, [n])
    call check(status, "chi_request_output", stat, "output misaligned for the type")
  end subroutine output_i32

  recursive subroutine output_i64(req, view, stat)
    type(chi_request_t), intent(in) :: req
    integer(c_int64_t), pointer, intent(out) :: view(:)
    integer(c_int32_t), intent(out), optional :: stat
    integer(c_size_t) :: n
    integer(c_int32_t) :: status

    status = view_elements(req%output, req%output_capacity, 8, .false., n)
    view => empty_i64
    if (status /= CHI_OK) nullify(view)
    if (n > 0) call c_f_pointer(req%output, view, [n])
    call check(status, "chi_request_output", stat, "output misaligned for the type")
  end subroutine output_i64

  recursive subroutine output_r32(req, view, stat)
    type(chi_request_t), intent(in) :: req
    real(c_float), pointer, intent(out) :: view(:)
    integer(c_int32_t), intent(out), optional :: stat
    integer(c_size_t) :: n
    integer(c_int32_t) :: status

    status = view_elements(req%output, req%output_capacity, 4, .false., n)
    view => empty_r32
    if (status /= CHI_OK) nullify(view)
    if (n > 0) call c_f_pointer(req%output, view, [n])
    call check(status, "chi_request_output", stat, "output misaligned for the type")
  end subroutine output_r32

  recursive subroutine output_r64(req, view, stat)
    type(chi_request_t), intent(in) :: req
    real(c_double), pointer, intent(out) :: view(:)
    integer(c_int32_t), intent(out), optional :: stat
    integer(c_size_t) :: n
    integer(c_int32_t) :: status

    status = view_elements(req%output, req%output_capacity, 8, .false., n)
    view => empty_r64
    if (status /= CHI_OK) nullify(view)
    if (n > 0) call c_f_pointer(req%output, view, [n])
    call check(status, "chi_request_output", stat, "output misaligned for the type")
  end subroutine output_r64

  ! chi_request_set_output(req, values) or (req, ptr, nbytes): copies the
  ! bytes into the output and sets req%output_size.  Returns CHI_OK, or
  ! CHI_ERR_TOO_LARGE (nothing copied) when they exceed output_capacity;
  ! a handler can return that status as it is.
  recursive function set_output_ptr(req, ptr, nbytes) result(status)
    type(chi_request_t), intent(inout) :: req
    type(c_ptr), intent(in) :: ptr
    integer(c_size_t), intent(in) :: nbytes
    integer(c_int32_t) :: status
    type(c_ptr) :: ignored

    if (nbytes > req%output_capacity) then
      status = CHI_ERR_TOO_LARGE
      return
    end if
    if (nbytes > 0) ignored = c_memcpy(req%output, ptr, nbytes)
    req%output_size = nbytes
    status = CHI_OK
  end function set_output_ptr

  recursive function set_output_i8(req, values) result(status)
    type(chi_request_t), intent(inout) :: req
    integer(c_int8_t), intent(in), target, contiguous :: values(:)
    integer(c_int32_t) :: status
    type(c_ptr) :: p

    p = c_null_ptr
    if (size(values) > 0) p = c_loc(values)
    status = set_output_ptr(req, p, array_bytes(size(values), storage_size(values)))
  end function set_output_i8

  recursive function set_output_i32(req, values) result(status)
    type(chi_request_t), intent(inout) :: req
    integer(c_int32_t), intent(in), target, contiguous :: values(:)
    integer(c_int32_t) :: status
    type(c_ptr) :: p

    p = c_null_ptr
    if (size(values) > 0) p = c_loc(values)
    status = set_output_ptr(req, p, array_bytes(size(values), storage_size(values)))
  end function set_output_i32

  recursive function set_output_i64(req, values) result(status)
    type(chi_request_t), intent(inout) :: req
    integer(c_int64_t), intent(in), target, contiguous :: values(:)
    integer(c_int32_t) :: status
    type(c_ptr) :: p

    p = c_null_ptr
    if (size(values) > 0) p = c_loc(values)
    status = set_output_ptr(req, p, array_bytes(size(values), storage_size(values)))
  end function set_output_i64

  recursive function set_output_r32(req, values) result(status)
    type(chi_request_t), intent(inout) :: req
    real(c_float), intent(in), target, contiguous :: values(:)
    integer(c_int32_t) :: status
    type(c_ptr) :: p

    p = c_null_ptr
    if (size(values) > 0) p = c_loc(values)
    status = set_output_ptr(req, p, array_bytes(size(values), storage_size(values)))
  end function set_output_r32

  recursive function set_output_r64(req, values) result(status)
    type(chi_request_t), intent(inout) :: req
    real(c_double), intent(in), target, contiguous :: values(:)
    integer(c_int32_t) :: status
    type(c_ptr) :: p

    p = c_null_ptr
    if (size(values) > 0) p = c_loc(values)
    status = set_output_ptr(req, p, array_bytes(size(values), storage_size(values)))
  end function set_output_r64
end module chimaera
