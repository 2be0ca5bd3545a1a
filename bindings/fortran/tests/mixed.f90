! fortran_mixed: one runtime, several languages.  Fortran handlers serve tasks
! submitted from C threads, C handlers serve tasks submitted from Fortran, and
! handlers of either language submit to the other from inside a task.  Any
! failed expectation ends the program with `error stop`.
module mixed_support
  use, intrinsic :: iso_c_binding
  use chimaera
  implicit none

  interface
    function mixed_register_c(rt) bind(C, name="mixed_register_c") result(r)
      import :: c_ptr, c_int
      type(c_ptr), value :: rt
      integer(c_int) :: r
    end function mixed_register_c
    function mixed_c_call_i64(rt, name, input, output) bind(C, name="mixed_c_call_i64") result(r)
      import :: c_ptr, c_int, c_char, c_int64_t
      type(c_ptr), value :: rt
      character(kind=c_char), dimension(*), intent(in) :: name
      integer(c_int64_t), value :: input
      integer(c_int64_t), intent(out) :: output
      integer(c_int) :: r
    end function mixed_c_call_i64
    function mixed_c_drives_fortran(rt, nthreads, tasks) &
        bind(C, name="mixed_c_drives_fortran") result(r)
      import :: c_ptr, c_int
      type(c_ptr), value :: rt
      integer(c_int), value :: nthreads, tasks
      integer(c_int) :: r
    end function mixed_c_drives_fortran
    function mixed_c_start(rt) bind(C, name="mixed_c_start") result(r)
      import :: c_ptr, c_int
      type(c_ptr), intent(out) :: rt
      integer(c_int) :: r
    end function mixed_c_start
    function mixed_c_stop(rt) bind(C, name="mixed_c_stop") result(r)
      import :: c_ptr, c_int
      type(c_ptr), value :: rt
      integer(c_int) :: r
    end function mixed_c_stop
  end interface

contains

  subroutine expect(cond, what)
    logical, intent(in) :: cond
    character(len=*), intent(in) :: what
    if (.not. cond) error stop "FAILED: " // what
  end subroutine expect

  ! f.axpy: input [a, x(1..k)] (real64), output y(i) = a * x(i) + 1.
  recursive function axpy_handler(req, user_data) bind(C, name="") result(status)
    type(chi_request_t), intent(inout) :: req
    type(c_ptr), value :: user_data
    integer(c_int32_t) :: status
    real(c_double), pointer :: in(:)

    if (c_associated(user_data)) then
      status = CHI_ERR_INTERNAL
      return
    end if
    call chi_request_input(req, in, status)
    if (status /= CHI_OK) return
    if (size(in) < 1) then
      status = CHI_ERR_INVALID
      return
    end if
    status = chi_request_set_output(req, in(1) * in(2:) + 1.0_c_double)
  end function axpy_handler

  ! f.chain: x -> c.triple(x) + 1, submitting to the C handler from inside
  ! this task.  user_data is c_loc of the chi_runtime.
  recursive function chain_handler(req, user_data) bind(C, name="") result(status)
    type(chi_request_t), intent(inout) :: req
    type(c_ptr), value :: user_data
    integer(c_int32_t) :: status
    type(chi_runtime), pointer :: rt
    integer(c_int64_t), pointer :: x(:)
    integer(c_int64_t) :: future, tripled(1)
    integer(c_int32_t) :: triple

    call c_f_pointer(user_data, rt)
    call chi_request_input(req, x, status)
    if (status /= CHI_OK) return
    if (size(x) /= 1) then
      status = CHI_ERR_INVALID
      return
    end if
    call rt%lookup("c.triple", triple, status)
    if (status /= CHI_OK) return
    call rt%submit(CHI_ROUTE_CPU, triple, x, future, status)
    if (status /= CHI_OK) return
    call rt%wait(future, tripled, stat=status)
    if (status /= CHI_OK) return
    status = chi_request_set_output(req, tripled + 1)
  end function chain_handler
end module mixed_support

program fortran_mixed
  use, intrinsic :: iso_c_binding
  use chimaera
  use mixed_support
  implicit none

  type(chi_runtime), target :: rt
  type(chi_runtime) :: borrowed
  type(c_ptr) :: c_owned
  integer(c_int32_t) :: m_triple, m_via, m_chain, stat
  integer(c_int64_t) :: fut, out1(1), result
  real(c_double) :: y(3)
  integer :: i

  call rt%init(num_workers=4, gpus=0)
  call rt%register_handler("f.axpy", axpy_handler)
  call rt%register_handler("f.chain", chain_handler, user_data=c_loc(rt), method=m_chain)
  call expect(mixed_register_c(rt%c_handle()) == CHI_OK, "C registers its handlers")

  ! Fortran -> C handler.
  call rt%lookup("c.triple", m_triple)
  do i = 1, 50
    call rt%submit(CHI_ROUTE_CPU, m_triple, [int(i, c_int64_t)], fut)
    call rt%wait(fut, out1)
    call expect(out1(1) == 3 * i, "Fortran submits to c.triple")
  end do

  ! C threads -> Fortran handler, concurrently.
  call expect(mixed_c_drives_fortran(rt%c_handle(), 4_c_int, 250_c_int) == 0, &
              "C threads submit to f.axpy")

  ! Fortran -> C handler -> Fortran handler.
  call rt%lookup("c.via_fortran", m_via)
  y = 0
  call rt%submit(CHI_ROUTE_CPU, m_via, [2.0_c_double, 1.0_c_double, 5.0_c_double, -4.0_c_double], fut)
  call rt%wait(fut, y)
  call expect(all(y == [3.0_c_double, 11.0_c_double, -7.0_c_double]), &
              "c.via_fortran forwards to f.axpy")

  ! C -> Fortran handler -> C handler.
  do i = -3, 3
    call expect(mixed_c_call_i64(rt%c_handle(), chi_c_string("f.chain"), int(i, c_int64_t), &
                                 result) == 0, "C submits to f.chain")
    call expect(result == 3 * i + 1, "f.chain result seen from C")
  end do

  ! Fortran -> Fortran handler -> C handler.
  call rt%submit(CHI_ROUTE_CPU, m_chain, [100_c_int64_t], fut)
  call rt%wait(fut, out1)
  call expect(out1(1) == 301, "f.chain result seen from Fortran")

  ! A Fortran handler's status reaches C unchanged (f.axpy: 7 bytes of input).
  call rt%submit(CHI_ROUTE_CPU, m_via, [1_c_int8_t, 2_c_int8_t, 3_c_int8_t, 4_c_int8_t, &
                 5_c_int8_t, 6_c_int8_t, 7_c_int8_t], fut)
  call rt%wait(fut, y, stat=stat)
  call expect(stat == CHI_ERR_INVALID, "a Fortran handler's status through C")

  call rt%destroy()

  ! A runtime started and owned by C, used from Fortran through attach.
  call expect(mixed_c_start(c_owned) == CHI_OK, "C starts a runtime")
  call borrowed%attach(c_owned)
  call borrowed%attach(c_owned, stat)
  call expect(stat == CHI_ERR_INVALID, "attach to a running chi_runtime")
  call borrowed%register_handler("f.axpy", axpy_handler)
  call expect(mixed_c_drives_fortran(c_owned, 2_c_int, 20_c_int) == 0, &
              "C threads submit to f.axpy on the attached runtime")
  call borrowed%destroy()
  call expect(.not. borrowed%is_running(), "destroy forgets an attached runtime")
  call expect(mixed_c_stop(c_owned) == CHI_OK, "C still owns and finalizes its runtime")

  print '(a)', "fortran_mixed: all checks passed"
end program fortran_mixed
