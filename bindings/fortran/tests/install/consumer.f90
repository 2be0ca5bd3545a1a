! A program built against an installed chimaera-fortran: a Fortran handler
! and a built-in method, then "OK".
module consumer_handlers
  use, intrinsic :: iso_c_binding
  use chimaera
  implicit none
contains
  recursive function negate(req, user_data) bind(C, name="") result(status)
    type(chi_request_t), intent(inout) :: req
    type(c_ptr), value :: user_data
    integer(c_int32_t) :: status
    integer(c_int64_t), pointer :: x(:)

    call chi_request_input(req, x, status)
    if (status /= CHI_OK) return
    status = chi_request_set_output(req, -x)
  end function negate
end module consumer_handlers

program consumer
  use, intrinsic :: iso_c_binding
  use chimaera
  use consumer_handlers
  implicit none
  type(chi_runtime) :: rt
  integer(c_int32_t) :: m
  integer(c_int64_t) :: future, out(2)

  call rt%init(num_workers=1, gpus=0)
  call rt%register_handler("consumer.negate", negate, method=m)
  call rt%submit(CHI_ROUTE_CPU, m, [5_c_int64_t, -7_c_int64_t], future)
  call rt%wait(future, out)
  if (any(out /= [-5_c_int64_t, 7_c_int64_t])) error stop "consumer.negate"
  call rt%submit(CHI_ROUTE_CPU, CHI_METHOD_ADD, [2_c_int64_t, 3_c_int64_t], future)
  call rt%wait(future, out(1:1))
  if (out(1) /= 5) error stop "chi.add"
  call rt%destroy()
  print '(a)', "OK " // chi_version_text()
end program consumer
