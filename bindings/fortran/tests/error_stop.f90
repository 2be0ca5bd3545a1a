! fortran_error_stop_*: without `stat`, a failure stops the program with the
! library's message.  Run by expect_failure.cmake, which requires a non-zero
! exit status and the message.  The argument picks the failure.
program fortran_error_stop
  use, intrinsic :: iso_c_binding
  use chimaera
  implicit none

  type(chi_runtime) :: rt, copy
  character(len=16) :: mode
  integer(c_int64_t) :: future
  integer(c_int32_t) :: method

  call get_command_argument(1, mode)
  select case (trim(mode))
  case ("submit")
    ! Not initialized: the C library reports a NULL runtime.
    call rt%submit(CHI_ROUTE_CPU, CHI_METHOD_ECHO, [1_c_int8_t], future)
  case ("lookup")
    call rt%init(num_workers=1, gpus=0)
    call rt%lookup("no.such.method", method)
  case ("copy")
    call rt%init(num_workers=1, gpus=0)
    copy = rt
  case default
    error stop "usage: fortran_error_stop submit|lookup|copy"
  end select
  print '(a)', "fortran_error_stop: no failure"
end program fortran_error_stop
