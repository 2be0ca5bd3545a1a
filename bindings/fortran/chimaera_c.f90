! chimaera_c -- raw Fortran interfaces to the chimaera host C API (chimaera.h).
!
! One bind(C) interface per exported function, bind(C) mirrors of the public
! structs and integer parameters for every CHI_* constant.  Everything here is
! a direct image of the C header; the idiomatic layer is module chimaera.
!
! Unsigned C types have no Fortran counterpart, so they travel bitwise in the
! signed integer of the same width: chi_method_t and uint32_t as
! integer(c_int32_t), chi_future_t and uint64_t as integer(c_int64_t).  A
! future is an opaque bit pattern: compare it with ==, never order it.  size_t
! is integer(c_size_t), int as integer(c_int), pointers type(c_ptr), function
! pointers type(c_funptr).  Strings passed in must end in c_null_char.
module chimaera_c
  use, intrinsic :: iso_c_binding, only: c_int, c_int8_t, c_int32_t, c_int64_t, c_size_t, &
                                         c_ptr, c_funptr, c_char
  implicit none
  private :: c_int, c_int8_t, c_int32_t, c_int64_t, c_size_t, c_ptr, c_funptr, c_char

  ! Versions of the header these interfaces mirror; compare with chi_version().
  include 'chimaera_version.inc'
  integer(c_int32_t), parameter :: CHI_VERSION_NUMBER = &
      CHI_VERSION_MAJOR * 10000 + CHI_VERSION_MINOR * 100 + CHI_VERSION_PATCH

  ! Routes (chi_route_t).  A GPU number n >= 0 is a route by itself.
  integer(c_int32_t), parameter :: CHI_ROUTE_CPU = -1
  integer(c_int32_t), parameter :: CHI_ROUTE_GPU_ANY = -2
  integer(c_int32_t), parameter :: CHI_ROUTE_LOCAL = -3

  ! chi_config_t%mode.
  integer(c_int32_t), parameter :: CHI_MODE_EMBEDDED = 0
  integer(c_int32_t), parameter :: CHI_MODE_CLIENT = 1

  ! Built-in methods (chi_method_t), registered by every runtime with these ids.
  integer(c_int32_t), parameter :: CHI_METHOD_ECHO = 1
  integer(c_int32_t), parameter :: CHI_METHOD_ADD = 2
  integer(c_int32_t), parameter :: CHI_METHOD_CHECKSUM = 3

  ! Statuses (chi_status_t); values are frozen.
  integer(c_int32_t), parameter :: CHI_OK = 0
  integer(c_int32_t), parameter :: CHI_ERR_INVALID = -1
  integer(c_int32_t), parameter :: CHI_ERR_NOMEM = -2
  integer(c_int32_t), parameter :: CHI_ERR_TIMEOUT = -3
  integer(c_int32_t), parameter :: CHI_ERR_AGAIN = -4
  integer(c_int32_t), parameter :: CHI_ERR_NOT_FOUND = -5
  integer(c_int32_t), parameter :: CHI_ERR_NO_DEVICE = -6
  integer(c_int32_t), parameter :: CHI_ERR_DISCONNECTED = -7
  integer(c_int32_t), parameter :: CHI_ERR_PROTOCOL = -8
  integer(c_int32_t), parameter :: CHI_ERR_TOO_LARGE = -9
  integer(c_int32_t), parameter :: CHI_ERR_CONFIG = -10
  integer(c_int32_t), parameter :: CHI_ERR_PERMISSION = -11
  integer(c_int32_t), parameter :: CHI_ERR_SHUTDOWN = -12
  integer(c_int32_t), parameter :: CHI_ERR_INTERNAL = -13
  ! Handlers may return their own codes at or below this value.
  integer(c_int32_t), parameter :: CHI_ERR_USER_BASE = -1000

  ! The most tasks (futures) one chi_submit_batch (chi_wait_batch) call takes.
  integer(c_int32_t), parameter :: CHI_BATCH_MAX = 1048576

  ! chi_config_t: always fill it with chi_config_init before changing fields.
  type, bind(C) :: chi_config_t
    integer(c_size_t) :: struct_size
    type(c_ptr) :: config_path        ! const char *, NULL: $CHI_CONFIG or defaults
    integer(c_int32_t) :: mode
    type(c_ptr) :: server_address     ! const char *
    integer(c_int32_t) :: num_workers
    integer(c_int32_t) :: gpus
    type(c_ptr) :: settings           ! const char *, YAML text of any config keys
  end type chi_config_t

  ! chi_request_t: a task as its handler sees it.  input is read-only.
  type, bind(C) :: chi_request_t
    integer(c_int32_t) :: method      ! chi_method_t (uint32)
    integer(c_int32_t) :: source      ! chi_route_t
    type(c_ptr) :: input              ! const void *
    integer(c_size_t) :: input_size
    type(c_ptr) :: output
    integer(c_size_t) :: output_capacity
    integer(c_size_t) :: output_size  ! set by the handler (0 on entry)
  end type chi_request_t

  ! chi_mem_ref_t: a reference to registered memory (uint64 fields).
  type, bind(C) :: chi_mem_ref_t
    integer(c_int64_t) :: region
    integer(c_int64_t) :: offset
    integer(c_int64_t) :: length
  end type chi_mem_ref_t

  ! chi_task_desc_t: one task of a batch (chi_submit_batch), the arguments
  ! chi_submit takes, e.g. chi_task_desc_t(CHI_METHOD_ECHO, c_loc(x), c_sizeof(x))
  ! for a target variable x.
  type, bind(C) :: chi_task_desc_t
    integer(c_int32_t) :: method      ! chi_method_t (uint32)
    type(c_ptr) :: input              ! const void *, input_size bytes, copied
    integer(c_size_t) :: input_size
  end type chi_task_desc_t

  ! chi_task_result_t: where one future's result goes (chi_wait_batch).
  type, bind(C) :: chi_task_result_t
    type(c_ptr) :: output             ! in: buffer for the output, or c_null_ptr to discard
    integer(c_size_t) :: output_capacity ! in: its size in bytes
    integer(c_size_t) :: output_size  ! out: bytes of output (or bytes needed)
    integer(c_int32_t) :: status      ! out: the task's status, as chi_wait returns it
  end type chi_task_result_t

  ! chi_dev_context_t: opaque POD handed by value to GPU kernels.
  type, bind(C) :: chi_dev_context_t
    integer(c_int64_t) :: opaque(32)
  end type chi_dev_context_t

  ! chi_gpu_launch_t: what the runtime hands a user orchestrator's launcher.
  type, bind(C) :: chi_gpu_launch_t
    integer(c_size_t) :: struct_size
    integer(c_int32_t) :: gpu
    type(c_ptr) :: stream
    integer(c_int32_t) :: blocks              ! uint32
    integer(c_int32_t) :: threads_per_block   ! uint32
    type(c_ptr) :: state
  end type chi_gpu_launch_t

  ! chi_gpu_orchestrator_t: a launcher and the GPU method names it serves.
  type, bind(C) :: chi_gpu_orchestrator_t
    integer(c_size_t) :: struct_size
    type(c_funptr) :: launch          ! chi_gpu_launch_fn
    type(c_ptr) :: method_names       ! const char *const *
    integer(c_int32_t) :: method_count ! uint32
  end type chi_gpu_orchestrator_t

  abstract interface
    ! chi_handler_t: a CPU handler.  Declare yours bind(C) with exactly this
    ! interface (and recursive: several workers may run it at once).
    function chi_handler_t(req, user_data) bind(C) result(status)
      import :: chi_request_t, c_ptr, c_int32_t
      type(chi_request_t), intent(inout) :: req
      type(c_ptr), value :: user_data
      integer(c_int32_t) :: status
    end function chi_handler_t

    ! chi_module_init_t: the function a module exports as chimaera_module_init.
    function chi_module_init_t(rt, chi_version) bind(C) result(status)
      import :: c_ptr, c_int32_t
      type(c_ptr), value :: rt
      integer(c_int32_t), value :: chi_version
      integer(c_int32_t) :: status
    end function chi_module_init_t

    ! chi_gpu_launch_fn: a user orchestrator's launcher.
    function chi_gpu_launch_fn(launch) bind(C) result(status)
      import :: chi_gpu_launch_t, c_int32_t
      type(chi_gpu_launch_t), intent(in) :: launch
      integer(c_int32_t) :: status
    end function chi_gpu_launch_fn
  end interface

  interface
    function chi_version() bind(C, name="chi_version") result(version)
      import :: c_int32_t
      integer(c_int32_t) :: version
    end function chi_version

    ! Returns a pointer to a static NUL-terminated string.
    function chi_version_string() bind(C, name="chi_version_string") result(str)
      import :: c_ptr
      type(c_ptr) :: str
    end function chi_version_string

    ! Returns a pointer to a static NUL-terminated string, never NULL.
    function chi_status_string(status) bind(C, name="chi_status_string") result(str)
      import :: c_ptr, c_int32_t
      integer(c_int32_t), value :: status
      type(c_ptr) :: str
    end function chi_status_string

    ! Thread-local; valid until this thread's next chi_* call.
    function chi_last_error_message() bind(C, name="chi_last_error_message") result(str)
      import :: c_ptr
      type(c_ptr) :: str
    end function chi_last_error_message

    subroutine chi_config_init(cfg) bind(C, name="chi_config_init")
      import :: chi_config_t
      type(chi_config_t), intent(out) :: cfg
    end subroutine chi_config_init

    ! cfg: c_loc of a chi_config_t, or c_null_ptr for defaults.
    ! rt: receives the runtime handle (c_null_ptr on failure).
    function chi_init(cfg, rt) bind(C, name="chi_init") result(status)
      import :: c_ptr, c_int32_t
      type(c_ptr), value :: cfg
      type(c_ptr), intent(out) :: rt
      integer(c_int32_t) :: status
    end function chi_init

    function chi_finalize(rt) bind(C, name="chi_finalize") result(status)
      import :: c_ptr, c_int32_t
      type(c_ptr), value :: rt
      integer(c_int32_t) :: status
    end function chi_finalize

    ! fn: c_funloc of a procedure with the chi_handler_t interface.
    ! method: c_loc of an integer(c_int32_t), or c_null_ptr.
    function chi_register_handler(rt, name, fn, user_data, method) &
        bind(C, name="chi_register_handler") result(status)
      import :: c_ptr, c_funptr, c_char, c_int32_t
      type(c_ptr), value :: rt
      character(kind=c_char), dimension(*), intent(in) :: name
      type(c_funptr), value :: fn
      type(c_ptr), value :: user_data
      type(c_ptr), value :: method
      integer(c_int32_t) :: status
    end function chi_register_handler

    function chi_method_lookup(rt, name, method) bind(C, name="chi_method_lookup") result(status)
      import :: c_ptr, c_char, c_int32_t
      type(c_ptr), value :: rt
      character(kind=c_char), dimension(*), intent(in) :: name
      integer(c_int32_t), intent(out) :: method
      integer(c_int32_t) :: status
    end function chi_method_lookup

    ! input: c_loc of input_size bytes (c_null_ptr when input_size is 0).
    function chi_submit(rt, route, method, input, input_size, future) &
        bind(C, name="chi_submit") result(status)
      import :: c_ptr, c_int32_t, c_int64_t, c_size_t
      type(c_ptr), value :: rt
      integer(c_int32_t), value :: route
      integer(c_int32_t), value :: method
      type(c_ptr), value :: input
      integer(c_size_t), value :: input_size
      integer(c_int64_t), intent(out) :: future
      integer(c_int32_t) :: status
    end function chi_submit

    ! output: c_loc of output_capacity bytes, or c_null_ptr to discard.
    ! output_size: c_loc of an integer(c_size_t), or c_null_ptr.
    function chi_wait(rt, future, timeout_ns, output, output_capacity, output_size) &
        bind(C, name="chi_wait") result(status)
      import :: c_ptr, c_int32_t, c_int64_t, c_size_t
      type(c_ptr), value :: rt
      integer(c_int64_t), value :: future
      integer(c_int64_t), value :: timeout_ns
      type(c_ptr), value :: output
      integer(c_size_t), value :: output_capacity
      type(c_ptr), value :: output_size
      integer(c_int32_t) :: status
    end function chi_wait

    function chi_test(rt, future, done) bind(C, name="chi_test") result(status)
      import :: c_ptr, c_int, c_int32_t, c_int64_t
      type(c_ptr), value :: rt
      integer(c_int64_t), value :: future
      integer(c_int), intent(out) :: done
      integer(c_int32_t) :: status
    end function chi_test

    function chi_release(rt, future) bind(C, name="chi_release") result(status)
      import :: c_ptr, c_int32_t, c_int64_t
      type(c_ptr), value :: rt
      integer(c_int64_t), value :: future
      integer(c_int32_t) :: status
    end function chi_release

    ! tasks: n task descriptions; futures: receives n futures, 0 from the
    ! first task that could not be queued on.
    ! submitted: c_loc of an integer(c_size_t) receiving the number queued, or c_null_ptr.
    function chi_submit_batch(rt, route, tasks, n, futures, submitted) &
        bind(C, name="chi_submit_batch") result(status)
      import :: c_ptr, c_int32_t, c_int64_t, c_size_t, chi_task_desc_t
      type(c_ptr), value :: rt
      integer(c_int32_t), value :: route
      type(chi_task_desc_t), intent(in) :: tasks(*)
      integer(c_size_t), value :: n
      integer(c_int64_t), intent(out) :: futures(*)
      type(c_ptr), value :: submitted
      integer(c_int32_t) :: status
    end function chi_submit_batch

    ! results: n results, their output and output_capacity set by the caller.
    ! done: c_loc of an integer(c_size_t) receiving the number of results
    ! taken (the 0-based index of the future it stopped at), or c_null_ptr.
    function chi_wait_batch(rt, futures, n, timeout_ns, results, done) &
        bind(C, name="chi_wait_batch") result(status)
      import :: c_ptr, c_int32_t, c_int64_t, c_size_t, chi_task_result_t
      type(c_ptr), value :: rt
      integer(c_int64_t), intent(in) :: futures(*)
      integer(c_size_t), value :: n
      integer(c_int64_t), value :: timeout_ns
      type(chi_task_result_t), intent(inout) :: results(*)
      type(c_ptr), value :: done
      integer(c_int32_t) :: status
    end function chi_wait_batch

    function chi_load_module(rt, path) bind(C, name="chi_load_module") result(status)
      import :: c_ptr, c_char, c_int32_t
      type(c_ptr), value :: rt
      character(kind=c_char), dimension(*), intent(in) :: path
      integer(c_int32_t) :: status
    end function chi_load_module

    ! gpu: a GPU number, or CHI_ROUTE_CPU for host memory.
    function chi_register_gpu_mem(rt, gpu, device_ptr, size, region) &
        bind(C, name="chi_register_gpu_mem") result(status)
      import :: c_ptr, c_int32_t, c_int64_t, c_size_t
      type(c_ptr), value :: rt
      integer(c_int32_t), value :: gpu
      type(c_ptr), value :: device_ptr
      integer(c_size_t), value :: size
      integer(c_int64_t), intent(out) :: region
      integer(c_int32_t) :: status
    end function chi_register_gpu_mem

    function chi_unregister_mem(rt, region) bind(C, name="chi_unregister_mem") result(status)
      import :: c_ptr, c_int32_t, c_int64_t
      type(c_ptr), value :: rt
      integer(c_int64_t), value :: region
      integer(c_int32_t) :: status
    end function chi_unregister_mem

    ! gpu: c_loc of an integer(c_int32_t), or c_null_ptr.
    function chi_mem_resolve(rt, ref, ptr, gpu) bind(C, name="chi_mem_resolve") result(status)
      import :: c_ptr, c_int32_t, chi_mem_ref_t
      type(c_ptr), value :: rt
      type(chi_mem_ref_t), intent(in) :: ref
      type(c_ptr), intent(out) :: ptr
      type(c_ptr), value :: gpu
      integer(c_int32_t) :: status
    end function chi_mem_resolve

    function chi_gpu_count(rt, count) bind(C, name="chi_gpu_count") result(status)
      import :: c_ptr, c_int32_t
      type(c_ptr), value :: rt
      integer(c_int32_t), intent(out) :: count
      integer(c_int32_t) :: status
    end function chi_gpu_count

    function chi_gpu_context(rt, gpu, ctx) bind(C, name="chi_gpu_context") result(status)
      import :: c_ptr, c_int32_t, chi_dev_context_t
      type(c_ptr), value :: rt
      integer(c_int32_t), value :: gpu
      type(chi_dev_context_t), intent(out) :: ctx
      integer(c_int32_t) :: status
    end function chi_gpu_context

    ! gpu: a GPU number, or -1 for every GPU.
    function chi_gpu_pause(rt, gpu) bind(C, name="chi_gpu_pause") result(status)
      import :: c_ptr, c_int32_t
      type(c_ptr), value :: rt
      integer(c_int32_t), value :: gpu
      integer(c_int32_t) :: status
    end function chi_gpu_pause

    function chi_gpu_resume(rt, gpu) bind(C, name="chi_gpu_resume") result(status)
      import :: c_ptr, c_int32_t
      type(c_ptr), value :: rt
      integer(c_int32_t), value :: gpu
      integer(c_int32_t) :: status
    end function chi_gpu_resume

    ! The launcher lives in CUDA/HIP code; Fortran can only pass it along.
    function chi_gpu_set_orchestrator(rt, gpu, orch) &
        bind(C, name="chi_gpu_set_orchestrator") result(status)
      import :: c_ptr, c_int32_t, chi_gpu_orchestrator_t
      type(c_ptr), value :: rt
      integer(c_int32_t), value :: gpu
      type(chi_gpu_orchestrator_t), intent(in) :: orch
      integer(c_int32_t) :: status
    end function chi_gpu_set_orchestrator
  end interface
end module chimaera_c
