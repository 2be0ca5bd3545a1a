! heat: a 2-D heat equation (Jacobi iteration) on chimaera's CPU workers.
!
! The grid is split into square tiles; every sweep submits one task per tile
! to a Fortran handler, which reads the old grid and writes the new one.
! Both grids are registered with the runtime as host memory, and each task
! carries chi_mem_ref_t references to just the columns it reads and writes,
! so the runtime bounds-checks every access (chi_mem_resolve).  The result is
! compared with a serial loop doing the same arithmetic, and both are timed.
!
! Usage: heat [n [sweeps [tile [workers]]]]   (defaults 512 200 64, workers
! from the configuration).  Exits non-zero if the results differ.
module heat_tiles
  use, intrinsic :: iso_c_binding
  use chimaera
  implicit none
  private
  public :: tile_task_t, tile_handler, sweep

  ! One tile's task: the interior points (i0:i1, j0:j1) of an (0:n+1)^2 grid.
  ! src references columns j0-1..j1+1 of the old grid, dst columns j0..j1 of
  ! the new one.
  type, bind(C) :: tile_task_t
    type(chi_mem_ref_t) :: src
    type(chi_mem_ref_t) :: dst
    integer(c_int32_t) :: n
    integer(c_int32_t) :: i0, i1, j0, j1
  end type tile_task_t

contains

  ! The Jacobi update of the points (i0:i1, j0:j1).
  pure subroutine sweep(u, v, i0, i1, j0, j1)
    real(c_double), intent(in) :: u(0:, 0:)
    real(c_double), intent(inout) :: v(0:, 0:)
    integer, intent(in) :: i0, i1, j0, j1
    integer :: i, j

    do j = j0, j1
      do i = i0, i1
        v(i, j) = 0.25_c_double * ((u(i - 1, j) + u(i + 1, j)) + (u(i, j - 1) + u(i, j + 1)))
      end do
    end do
  end subroutine sweep

  ! heat.tile: resolves the task's references and updates its tile.
  ! user_data is c_loc of the chi_runtime (needed for mem_resolve).
  recursive function tile_handler(req, user_data) bind(C, name="") result(status)
    type(chi_request_t), intent(inout) :: req
    type(c_ptr), value :: user_data
    integer(c_int32_t) :: status
    type(chi_runtime), pointer :: rt
    type(tile_task_t), pointer :: task
    type(c_ptr) :: psrc, pdst
    real(c_double), pointer :: cols(:, :), u(:, :), v(:, :)
    type(tile_task_t) :: probe
    integer :: n

    req%output_size = 0
    if (req%input_size /= c_sizeof(probe) .or. &
        mod(transfer(req%input, 0_c_intptr_t), 8_c_intptr_t) /= 0) then
      status = CHI_ERR_INVALID
      return
    end if
    call c_f_pointer(user_data, rt)
    call c_f_pointer(req%input, task)
    n = task%n
    call rt%mem_resolve(task%src, psrc, stat=status)
    if (status /= CHI_OK) return
    call rt%mem_resolve(task%dst, pdst, stat=status)
    if (status /= CHI_OK) return

    ! View the referenced columns with the grid's own indices.
    call c_f_pointer(psrc, cols, [n + 2, task%j1 - task%j0 + 3])
    u(0:, task%j0 - 1:) => cols
    call c_f_pointer(pdst, cols, [n + 2, task%j1 - task%j0 + 1])
    v(0:, task%j0:) => cols
    call tile_sweep(u, v, task%i0, task%i1, task%j0, task%j1)
    status = CHI_OK
  end function tile_handler

  ! sweep over arrays whose second dimension starts at j0 - 1 (u) or j0 (v).
  pure subroutine tile_sweep(u, v, i0, i1, j0, j1)
    integer, intent(in) :: i0, i1, j0, j1
    real(c_double), intent(in) :: u(0:, j0 - 1:)
    real(c_double), intent(inout) :: v(0:, j0:)
    integer :: i, j

    do j = j0, j1
      do i = i0, i1
        v(i, j) = 0.25_c_double * ((u(i - 1, j) + u(i + 1, j)) + (u(i, j - 1) + u(i, j + 1)))
      end do
    end do
  end subroutine tile_sweep
end module heat_tiles

program heat
  use, intrinsic :: iso_c_binding
  use, intrinsic :: iso_fortran_env, only: int64, error_unit
  use chimaera
  use heat_tiles
  implicit none

  integer, parameter :: max_in_flight = 256
  type(chi_runtime), target :: rt
  real(c_double), allocatable, target :: a(:, :), b(:, :), ref(:, :), ref_next(:, :)
  integer(c_int64_t) :: region(2), column_bytes
  integer(c_int64_t), allocatable :: futures(:)
  type(tile_task_t), target :: task
  integer(c_int32_t) :: m_tile, workers, ngpu
  integer :: n, sweeps, tile, it, i0, j0, ntiles, in_flight, oldest, k, src
  integer(int64) :: t0, t1, rate
  real(c_double) :: t_serial, t_tasks, diff

  call read_arguments(n, sweeps, tile, workers)

  ! Hot top edge, everything else cold.
  allocate(a(0:n + 1, 0:n + 1), b(0:n + 1, 0:n + 1))
  a = 0
  a(0, :) = 1
  b = a
  ref = a
  ref_next = a

  call system_clock(t0, rate)
  do it = 1, sweeps
    call sweep(ref, ref_next, 1, n, 1, n)
    call swap(ref, ref_next)
  end do
  call system_clock(t1)
  t_serial = real(t1 - t0, c_double) / real(rate, c_double)

  call rt%init(num_workers=workers)
  call rt%register_handler("heat.tile", tile_handler, user_data=c_loc(rt), method=m_tile)
  call rt%register_mem(CHI_ROUTE_CPU, c_loc(a), size(a, kind=c_size_t) * c_sizeof(a(0, 0)), &
                       region(1))
  call rt%register_mem(CHI_ROUTE_CPU, c_loc(b), size(b, kind=c_size_t) * c_sizeof(b(0, 0)), &
                       region(2))
  column_bytes = int(n + 2, c_int64_t) * c_sizeof(a(0, 0))
  ntiles = ((n + tile - 1) / tile)**2
  allocate(futures(max_in_flight))

  call system_clock(t0)
  src = 1
  do it = 1, sweeps
    ! Tasks of one sweep are independent; the sweep ends when all are done.
    in_flight = 0
    oldest = 1
    do j0 = 1, n, tile
      do i0 = 1, n, tile
        task%n = int(n, c_int32_t)
        task%i0 = int(i0, c_int32_t)
        task%i1 = int(min(i0 + tile - 1, n), c_int32_t)
        task%j0 = int(j0, c_int32_t)
        task%j1 = int(min(j0 + tile - 1, n), c_int32_t)
        task%src = chi_mem_ref_t(region(src), (task%j0 - 1_c_int64_t) * column_bytes, &
                                 (task%j1 - task%j0 + 3_c_int64_t) * column_bytes)
        task%dst = chi_mem_ref_t(region(3 - src), task%j0 * column_bytes, &
                                 (task%j1 - task%j0 + 1_c_int64_t) * column_bytes)
        if (in_flight == max_in_flight) then
          ! Every slot holds a result until it is waited for: drain the oldest.
          call rt%wait(futures(oldest))
          oldest = mod(oldest, max_in_flight) + 1
          in_flight = in_flight - 1
        end if
        k = mod(oldest - 1 + in_flight, max_in_flight) + 1
        call rt%submit_buffer(CHI_ROUTE_CPU, m_tile, task, c_sizeof(task), futures(k))
        in_flight = in_flight + 1
      end do
    end do
    do while (in_flight > 0)
      call rt%wait(futures(oldest))
      oldest = mod(oldest, max_in_flight) + 1
      in_flight = in_flight - 1
    end do
    src = 3 - src
  end do
  call system_clock(t1)
  t_tasks = real(t1 - t0, c_double) / real(rate, c_double)

  if (src == 1) then
    diff = maxval(abs(a - ref))
  else
    diff = maxval(abs(b - ref))
  end if
  print '(a,i0,a,i0,a,i0,a,i0,a)', "heat: ", n, "x", n, " interior points, ", sweeps, &
        " sweeps, ", ntiles, " tiles per sweep"
  print '(a,f10.4,a)', "  serial loop:          ", t_serial, " s"
  print '(a,f10.4,a,f6.2,a)', "  chimaera CPU tasks:   ", t_tasks, " s  (", &
        t_serial / max(t_tasks, tiny(1.0_c_double)), "x the serial speed)"
  print '(a,es10.3)', "  max |tasks - serial|: ", diff

  ngpu = rt%gpu_count()
  if (ngpu > 0) then
    if (src == 1) then
      call gpu_checksum(a)
    else
      call gpu_checksum(b)
    end if
  else
    print '(a)', "  no GPU: GPU checksum comparison skipped"
  end if

  call rt%unregister_mem(region(1))
  call rt%unregister_mem(region(2))
  call rt%destroy()
  deallocate(a, b, ref, ref_next, futures)

  if (.not. (diff < 1.0e-12_c_double)) then
    write (error_unit, '(a)') "heat: the tasked result differs from the serial one"
    error stop 1
  end if

contains

  subroutine swap(x, y)
    real(c_double), allocatable, intent(inout) :: x(:, :), y(:, :)
    real(c_double), allocatable :: t(:, :)
    call move_alloc(x, t)
    call move_alloc(y, x)
    call move_alloc(t, y)
  end subroutine swap

  ! The GPU orchestrator serves only the built-in methods (echo, add,
  ! checksum), not Fortran handlers, so the GPU's part here is to checksum one
  ! tile of the result and agree with the CPU workers' checksum.
  subroutine gpu_checksum(grid)
    real(c_double), intent(in) :: grid(0:, 0:)
    real(c_double) :: block(16 * 16)
    integer(c_int64_t) :: f_cpu, f_gpu, sum_cpu(1), sum_gpu(1)
    integer :: m

    m = min(16, n)
    block = 0
    block(1:m * m) = reshape(grid(1:m, 1:m), [m * m])
    call rt%submit(CHI_ROUTE_CPU, CHI_METHOD_CHECKSUM, block(1:m * m), f_cpu)
    call rt%submit(CHI_ROUTE_GPU_ANY, CHI_METHOD_CHECKSUM, block(1:m * m), f_gpu)
    call rt%wait(f_cpu, sum_cpu)
    call rt%wait(f_gpu, sum_gpu)
    print '(a,i0,a,i0,a,z16.16,a,z16.16)', "  chi.checksum of a ", m, "x", m, &
          " tile: CPU ", sum_cpu(1), ", GPU ", sum_gpu(1)
    if (sum_cpu(1) /= sum_gpu(1)) then
      write (error_unit, '(a)') "heat: CPU and GPU checksums differ"
      error stop 1
    end if
  end subroutine gpu_checksum

  subroutine read_arguments(n, sweeps, tile, workers)
    integer, intent(out) :: n, sweeps, tile
    integer(c_int32_t), intent(out) :: workers
    integer :: values(4), k, ios
    character(len=32) :: arg

    values = [512, 200, 64, 0]
    do k = 1, min(command_argument_count(), 4)
      call get_command_argument(k, arg)
      read (arg, *, iostat=ios) values(k)
      if (ios /= 0 .or. values(k) < 0 .or. (k < 4 .and. values(k) < 1)) then
        write (error_unit, '(a)') "usage: heat [n [sweeps [tile [workers]]]] (positive integers)"
        error stop 2
      end if
    end do
    n = values(1)
    sweeps = values(2)
    tile = values(3)
    workers = int(values(4), c_int32_t)
  end subroutine read_arguments
end program heat
