! fortran_limits: a handler with a 32 MiB local array, which overflows the
! default worker stack, runs once worker_stack_size is raised through the
! settings argument; settings errors and unknown method ids are statuses.
! Any failed expectation ends the program with `error stop`.
module limits_support
  use, intrinsic :: iso_c_binding
  use chimaera
  implicit none

  integer, parameter :: scratch_len = 4 * 1024 * 1024  ! real64: 32 MiB

contains

  subroutine expect_stat(got, want, what)
    integer(c_int32_t), intent(in) :: got, want
    character(len=*), intent(in) :: what
    character(len=80) :: line
    if (got /= want) then
      write (line, '("status ",i0," (expected ",i0,")")') got, want
      error stop "FAILED: " // what // ": " // trim(line) // ": " // chi_last_error()
    end if
  end subroutine expect_stat

  ! f.big_frame: fills a local (stack) array of 32 MiB and returns its sum.
  recursive function big_frame_handler(req, user_data) bind(C, name="") result(status)
    type(chi_request_t), intent(inout) :: req
    type(c_ptr), value :: user_data
    integer(c_int32_t) :: status
    real(c_double) :: scratch(scratch_len)
    real(c_double), pointer :: y(:)
    integer :: i

    if (c_associated(user_data)) then
      status = CHI_ERR_INTERNAL
      return
    end if
    do i = 1, scratch_len
      scratch(i) = real(mod(i, 1000), c_double)
    end do
    call chi_request_output(req, y, status)
    if (status /= CHI_OK) return
    y(1) = sum(scratch)
    req%output_size = c_sizeof(y(1))
    status = CHI_OK
  end function big_frame_handler

  pure function expected_sum() result(total)
    real(c_double) :: total
    integer :: i
    total = 0
    do i = 1, scratch_len
      total = total + real(mod(i, 1000), c_double)
    end do
  end function expected_sum

end module limits_support

program fortran_limits
  use, intrinsic :: iso_c_binding
  use chimaera
  use limits_support
  implicit none

  type(chi_runtime) :: rt, bad
  integer(c_int32_t) :: stat, m_big, k
  integer(c_int64_t) :: fut
  real(c_double) :: total(1)
  integer(c_int8_t) :: one(1)

  ! Every key of the configuration file through `settings`, nested keys dotted.
  call rt%init(num_workers=2_c_int32_t, gpus=0_c_int32_t, &
               settings="{worker_stack_size: 64M, queue_depth: 4096, gpu.lease_us: 0}")
  call rt%register_handler("f.big_frame", big_frame_handler, method=m_big)
  do k = 1, 4
    call rt%submit(CHI_ROUTE_CPU, m_big, one, fut)
    call rt%wait(fut, total)
    if (total(1) /= expected_sum()) error stop "FAILED: f.big_frame sum"
  end do

  ! An id never registered on this runtime.
  call rt%submit(CHI_ROUTE_CPU, 4000_c_int32_t, one, fut, stat)
  call expect_stat(stat, CHI_ERR_NOT_FOUND, "submit of an unregistered method id")
  call rt%destroy()

  ! Settings errors are CHI_ERR_CONFIG with a message naming the field.
  call bad%init(gpus=0_c_int32_t, settings="{worker_stack_size: 12X}", stat=stat)
  call expect_stat(stat, CHI_ERR_CONFIG, "a bad size")
  if (index(chi_last_error(), "chi_config_t.settings") == 0) &
    error stop "FAILED: the message names chi_config_t.settings"
  call bad%init(gpus=0_c_int32_t, settings="wrokers: 2", stat=stat)
  call expect_stat(stat, CHI_ERR_CONFIG, "an unknown key")
  if (bad%is_running()) error stop "FAILED: a failed init leaves no runtime"

  print '(a)', "fortran_limits: all checks passed"
end program fortran_limits
