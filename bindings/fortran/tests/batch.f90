! fortran_batch: chi_submit_batch and chi_wait_batch from Fortran, through
! type(chi_runtime)'s submit_batch and wait_batch and the raw interfaces:
! chi.echo of mixed sizes and chi.add in one batch, a task's failure inside
! a batch, a too-large input stopping submission, a too-small buffer
! stopping the wait, and batch futures with the one-task calls.  The bind(C)
! mirrors are checked against the C layout.  Any failed expectation ends
! the program with `error stop`.
module batch_support
  use, intrinsic :: iso_c_binding
  use chimaera
  implicit none

  interface
    function ftest_batch_layout(values, cap) bind(C, name="ftest_batch_layout") result(n)
      import :: c_int64_t, c_int
      integer(c_int64_t), intent(out) :: values(*)
      integer(c_int), value :: cap
      integer(c_int) :: n
    end function ftest_batch_layout
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
      error stop "FAILED: " // what // ": " // trim(line) // ": " // chi_last_error()
    end if
  end subroutine expect_stat

  integer(c_intptr_t) function address(p)
    type(c_ptr), intent(in) :: p
    address = transfer(p, 0_c_intptr_t)
  end function address

  ! chi_task_desc_t and chi_task_result_t have the C structs' sizes and
  ! field offsets, and CHI_BATCH_MAX its value.
  subroutine check_layout()
    integer(c_int64_t) :: c(16), f(10)
    type(chi_task_desc_t), target :: desc
    type(chi_task_result_t), target :: res
    integer :: n, k

    n = ftest_batch_layout(c, size(c))
    call expect(n == size(f), "ftest_batch_layout count")
    f = [c_sizeof(desc), &
         address(c_loc(desc%method)) - address(c_loc(desc)), &
         address(c_loc(desc%input)) - address(c_loc(desc)), &
         address(c_loc(desc%input_size)) - address(c_loc(desc)), &
         c_sizeof(res), &
         address(c_loc(res%output)) - address(c_loc(res)), &
         address(c_loc(res%output_capacity)) - address(c_loc(res)), &
         address(c_loc(res%output_size)) - address(c_loc(res)), &
         address(c_loc(res%status)) - address(c_loc(res)), &
         int(CHI_BATCH_MAX, c_int64_t)]
    do k = 1, n
      if (c(k) /= f(k)) then
        print '("layout item ",i0,": C ",i0,", Fortran ",i0)', k, c(k), f(k)
        error stop "FAILED: batch struct layout differs from C"
      end if
    end do
  end subroutine check_layout

end module batch_support

program fortran_batch
  use, intrinsic :: iso_c_binding
  use chimaera
  use batch_support
  implicit none

  integer, parameter :: n = 48, width = 16
  type(chi_runtime) :: rt
  integer(c_int64_t), target :: inputs(width, n), outputs(width, n), one(width)
  integer(c_int8_t), allocatable, target :: huge(:)
  type(chi_task_desc_t) :: tasks(n)
  type(chi_task_result_t) :: results(n)
  integer(c_int64_t) :: futures(n)
  integer(c_size_t) :: sent, done, got
  integer(c_int32_t) :: stat, routes(2)
  integer :: i, k, r, lens(n)
  logical :: finished
  character(len=:), allocatable :: message

  call check_layout()
  call rt%init(num_workers=2_c_int32_t, gpus=0_c_int32_t)

  ! Odd tasks echo 0..16 int64 values (0..128 bytes; 0 bytes with no input
  ! pointer), even tasks add two; every result is checked, on both CPU routes.
  do i = 1, n
    do k = 1, width
      inputs(k, i) = int(i, c_int64_t) * 1000 + k
    end do
    if (mod(i, 2) == 1) then
      lens(i) = mod(i, width + 1)
      if (lens(i) == 0) then
        tasks(i) = chi_task_desc_t(CHI_METHOD_ECHO, c_null_ptr, 0_c_size_t)
      else
        tasks(i) = chi_task_desc_t(CHI_METHOD_ECHO, c_loc(inputs(1, i)), &
                                   int(8 * lens(i), c_size_t))
      end if
    else
      lens(i) = 1
      tasks(i) = chi_task_desc_t(CHI_METHOD_ADD, c_loc(inputs(1, i)), 16_c_size_t)
    end if
  end do
  routes = [CHI_ROUTE_CPU, CHI_ROUTE_LOCAL]
  do r = 1, size(routes)
    outputs = -1
    do i = 1, n
      results(i) = chi_task_result_t(c_loc(outputs(1, i)), int(8 * width, c_size_t), &
                                     999_c_size_t, 999_c_int32_t)
    end do
    call rt%submit_batch(routes(r), tasks, futures, sent)
    call expect(sent == n, "every task submitted")
    call expect(all(futures /= 0), "every future set")
    call rt%wait_batch(futures, results, done)
    call expect(done == n, "every result taken")
    do i = 1, n
      call expect_stat(results(i)%status, CHI_OK, "a task of the batch")
      call expect(results(i)%output_size == int(8 * lens(i), c_size_t), "output size")
      if (mod(i, 2) == 1) then
        call expect(all(outputs(1:lens(i), i) == inputs(1:lens(i), i)), "chi.echo output")
      else
        call expect(outputs(1, i) == inputs(1, i) + inputs(2, i), "chi.add output")
      end if
      if (lens(i) < width) then
        call expect(outputs(lens(i) + 1, i) == -1, "nothing written past the output")
      end if
    end do
  end do

  ! A task's failure is its result: chi.add of 3 bytes is CHI_ERR_INVALID,
  ! the tasks after it still give theirs.  Through the raw interfaces, with
  ! no count wanted back.
  tasks(1) = chi_task_desc_t(CHI_METHOD_ECHO, c_loc(inputs(1, 1)), 8_c_size_t)
  tasks(2) = chi_task_desc_t(CHI_METHOD_ADD, c_loc(inputs(1, 2)), 3_c_size_t)
  tasks(3) = chi_task_desc_t(CHI_METHOD_ADD, c_loc(inputs(1, 3)), 16_c_size_t)
  do i = 1, 3
    results(i) = chi_task_result_t(c_loc(outputs(1, i)), int(8 * width, c_size_t), 0, 0)
  end do
  stat = chi_submit_batch(rt%c_handle(), CHI_ROUTE_CPU, tasks, 3_c_size_t, futures, c_null_ptr)
  call expect_stat(stat, CHI_OK, "raw chi_submit_batch")
  stat = chi_wait_batch(rt%c_handle(), futures, 3_c_size_t, -1_c_int64_t, results, c_null_ptr)
  call expect_stat(stat, CHI_OK, "raw chi_wait_batch: a task's failure does not stop it")
  call expect_stat(results(1)%status, CHI_OK, "echo before the failure")
  call expect_stat(results(2)%status, CHI_ERR_INVALID, "chi.add of 3 bytes")
  call expect_stat(results(3)%status, CHI_OK, "chi.add after the failure")
  call expect(outputs(1, 1) == inputs(1, 1), "echo before the failure: output")
  call expect(outputs(1, 3) == inputs(1, 3) + inputs(2, 3), "chi.add after the failure: output")

  ! An input over any max_inline_payload (1 MiB) stops submission there:
  ! the task before it is queued, its own future and the later ones are 0.
  allocate(huge(1048577))
  huge = 0
  tasks(1) = chi_task_desc_t(CHI_METHOD_ECHO, c_loc(inputs(1, 1)), 16_c_size_t)
  tasks(2) = chi_task_desc_t(CHI_METHOD_ECHO, c_loc(huge), int(size(huge), c_size_t))
  tasks(3) = chi_task_desc_t(CHI_METHOD_ECHO, c_loc(inputs(1, 3)), 16_c_size_t)
  futures = -1
  call rt%submit_batch(CHI_ROUTE_CPU, tasks(1:3), futures(1:3), sent, stat)
  message = chi_last_error()
  call expect_stat(stat, CHI_ERR_TOO_LARGE, "a too-large input in a batch")
  call expect(index(message, "tasks[1]") > 0, "the message names the task: " // message)
  call expect(sent == 1, "the task before it submitted")
  call expect(futures(1) /= 0 .and. all(futures(2:3) == 0), "futures of the tasks not queued")
  results(1) = chi_task_result_t(c_loc(outputs(1, 1)), int(8 * width, c_size_t), 0, 0)
  call rt%wait_batch(futures(1:1), results(1:1), done)
  call expect(done == 1 .and. results(1)%output_size == 16, "the task before it ran")
  call expect(all(outputs(1:2, 1) == inputs(1:2, 1)), "the task before it: output")
  deallocate(huge)

  ! A buffer too small stops the wait at that future, which stays valid:
  ! wait again from there with a larger one.
  do i = 1, 4
    tasks(i) = chi_task_desc_t(CHI_METHOD_ECHO, c_loc(inputs(1, i)), int(8 * width, c_size_t))
    results(i) = chi_task_result_t(c_loc(outputs(1, i)), int(8 * width, c_size_t), 0, 0)
  end do
  results(3)%output_capacity = 8
  call rt%submit_batch(CHI_ROUTE_CPU, tasks(1:4), futures(1:4))
  call rt%wait_batch(futures(1:4), results(1:4), done, stat=stat)
  call expect_stat(stat, CHI_ERR_TOO_LARGE, "a buffer too small")
  call expect(done == 2, "stopped at the third future")
  call expect(results(3)%output_size == int(8 * width, c_size_t), "the size needed")
  results(3)%output_capacity = int(8 * width, c_size_t)
  call rt%wait_batch(futures(3:4), results(3:4), done)
  call expect(done == 2, "the rest taken")
  do i = 1, 4
    call expect(all(outputs(:, i) == inputs(:, i)), "echo after the retry")
  end do
  ! Those futures are consumed: waiting again stops at once.
  call rt%wait_batch(futures(1:1), results(1:1), done, stat=stat)
  call expect_stat(stat, CHI_ERR_INVALID, "a consumed future")
  call expect(done == 0, "nothing taken from a consumed future")

  ! Futures of a batch with the one-task calls, and one-task futures in a batch.
  call rt%submit_batch(CHI_ROUTE_CPU, tasks(1:3), futures(1:3))
  finished = .false.
  do while (.not. finished)
    call rt%test(futures(1), finished)
  end do
  one = 0
  call rt%wait(futures(1), one, got)
  call expect(got == int(8 * width, c_size_t) .and. all(one == inputs(:, 1)), &
              "chi_wait on a batch future")
  call rt%release(futures(2))
  call rt%wait(futures(3))
  call rt%submit(CHI_ROUTE_CPU, CHI_METHOD_ADD, inputs(1:2, 5), futures(1))
  call rt%submit(CHI_ROUTE_LOCAL, CHI_METHOD_ECHO, inputs(:, 6), futures(2))
  outputs(:, 1:2) = -1
  do i = 1, 2
    results(i) = chi_task_result_t(c_loc(outputs(1, i)), int(8 * width, c_size_t), 0, 0)
  end do
  call rt%wait_batch(futures(1:2), results(1:2))
  call expect(outputs(1, 1) == inputs(1, 5) + inputs(2, 5), "chi_submit future in a batch")
  call expect(all(outputs(:, 2) == inputs(:, 6)), "chi_submit future in a batch: echo")

  ! Argument checks: too few futures or results, n over CHI_BATCH_MAX, and
  ! empty batches.
  call rt%submit_batch(CHI_ROUTE_CPU, tasks(1:3), futures(1:2), sent, stat)
  call expect_stat(stat, CHI_ERR_INVALID, "fewer futures than tasks")
  call expect(sent == 0, "nothing submitted")
  call rt%wait_batch(futures(1:3), results(1:2), done, stat=stat)
  call expect_stat(stat, CHI_ERR_INVALID, "fewer results than futures")
  stat = chi_submit_batch(rt%c_handle(), CHI_ROUTE_CPU, tasks, int(CHI_BATCH_MAX, c_size_t) + 1, &
                          futures, c_null_ptr)
  call expect_stat(stat, CHI_ERR_INVALID, "n over CHI_BATCH_MAX")
  call rt%submit_batch(CHI_ROUTE_CPU, tasks(1:0), futures(1:0), sent)
  call expect(sent == 0, "an empty batch")
  call rt%wait_batch(futures(1:0), results(1:0), done, timeout_ns=0_c_int64_t)
  call expect(done == 0, "an empty wait")

  call rt%destroy()
  print '(a)', "fortran_batch: all checks passed"
end program fortran_batch
