# GPU backend: CUDA test programs (exit 77, shown as skipped, without a GPU).
# They link the shared CUDA runtime like the library (one cudart per process),
# except test_gpu_orchestrator: a user's .cu gets nvcc's default static cudart,
# and the orchestrator macro must work across the two runtime instances.
if(CHI_HAVE_CUDA)
  chi_add_test(test_gpu SOURCES gpu/test_gpu.cu GPU TIMEOUT 600 LABELS gpu)
  chi_add_test(test_gpu_orchestrator SOURCES gpu/test_gpu_orchestrator.cu GPU TIMEOUT 300 LABELS gpu)
  # Device-wide CUDA calls and lazy loading beside the leased orchestrator.
  chi_add_test(test_gpu_coexist SOURCES gpu/test_gpu_coexist.cu GPU TIMEOUT 300 LABELS gpu)
  # Parked GPUs: park and start hammered from threads, a handler's GPU->CPU
  # tasks, pause, finalize and chi_gpu_context (docs/gpu.md, "Parked GPUs").
  chi_add_test(test_gpu_park SOURCES gpu/test_gpu_park.cu GPU TIMEOUT 300 LABELS gpu)
  # GPU->GPU across GPUs from device code (two GPUs with peer access, else skipped).
  chi_add_test(test_gpu_peer SOURCES gpu/test_gpu_peer.cu GPU TIMEOUT 300 LABELS gpu)
  # Waiting device submits from a full-device grid, chi_dev_release.
  chi_add_test(test_gpu_device_submit SOURCES gpu/test_gpu_device_submit.cu GPU TIMEOUT 300 LABELS gpu)
  # LL words after a generation cycle of their slot (issue 49): each route that
  # loads LL words early, the cycle shortened by a test hook; the _full variant
  # runs the review's recipe, 16,777,214 real tasks (about a minute; label gpu_long).
  chi_add_test(test_gpu_ll_cycle SOURCES gpu/test_gpu_ll_cycle.cu GPU TIMEOUT 120 LABELS gpu)
  add_test(NAME test_gpu_ll_cycle_full COMMAND test_gpu_ll_cycle full)
  set_tests_properties(test_gpu_ll_cycle_full PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77 LABELS "gpu;gpu_long")
  # A CPU handler that blocks its poller: the other pollers steal its part's tasks.
  chi_add_test(test_gpu_poller_steal SOURCES gpu/test_gpu_poller_steal.cu GPU TIMEOUT 300 LABELS gpu)
  # The same with the pollers parked first: the watcher blocks, sleepers steal.
  add_test(NAME test_gpu_poller_steal_parked COMMAND test_gpu_poller_steal parked)
  set_tests_properties(test_gpu_poller_steal_parked PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77 LABELS gpu)
  # A device handler that traps / reads an unmapped address: contained.
  chi_add_test(test_gpu_fault SOURCES gpu/test_gpu_fault.cu GPU TIMEOUT 120 LABELS gpu)
  set_target_properties(test_gpu_fault PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
  add_test(NAME test_gpu_fault_oob COMMAND test_gpu_fault oob)
  set_tests_properties(test_gpu_fault_oob PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77 LABELS gpu)
  # An ordinary CUDA program beside a busy chimaera-server, without and with MPS.
  if(TARGET chimaera-server)
    chi_add_test(test_gpu_beside_server SOURCES gpu/test_gpu_beside_server.cu GPU TIMEOUT 300 LABELS "gpu;server")
    add_dependencies(test_gpu_beside_server chimaera-server)
    target_compile_definitions(test_gpu_beside_server PRIVATE
      CHI_SERVER_PATH="$<TARGET_FILE:chimaera-server>" CHI_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
    set_target_properties(test_gpu_beside_server PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
      CUDA_RUNTIME_LIBRARY Shared)
    target_link_libraries(test_gpu_beside_server PRIVATE CUDA::cudart)
  endif()
  # Kernels of client processes that submit on every route (docs/server.md, "Client kernels").
  if(TARGET chimaera-server)
    chi_add_test(test_gpu_client SOURCES gpu/test_gpu_client.cu GPU TIMEOUT 300 LABELS "gpu;client;server")
    add_dependencies(test_gpu_client chimaera-server)
    # The server's module for the device memory case: reads a client's region with
    # cudaMemcpy (CPU handler) and with chi_dev_mem_resolve (GPU handler, a user orchestrator).
    add_library(chi_test_client_mem_module MODULE gpu/client_mem_module.c gpu/client_mem_module_gpu.cu)
    target_link_libraries(chi_test_client_mem_module PRIVATE chimaera::chimaera CUDA::cudart)
    set_target_properties(chi_test_client_mem_module PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
      CUDA_RUNTIME_LIBRARY Shared C_VISIBILITY_PRESET hidden CUDA_VISIBILITY_PRESET hidden)
    add_dependencies(test_gpu_client chi_test_client_mem_module)
    target_compile_definitions(test_gpu_client PRIVATE CHI_SERVER_PATH="$<TARGET_FILE:chimaera-server>"
      CHI_MEM_MODULE_PATH="$<TARGET_FILE:chi_test_client_mem_module>")
    set_target_properties(test_gpu_client PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
      CUDA_RUNTIME_LIBRARY Shared)
    target_compile_options(test_gpu_client PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)
    target_link_libraries(test_gpu_client PRIVATE CUDA::cudart)
    # A client SIGKILLed while a server handler reads its device memory (issue 49).
    add_test(NAME test_gpu_client_mem_kill COMMAND test_gpu_client mem-kill)
    set_tests_properties(test_gpu_client_mem_kill PROPERTIES TIMEOUT 180 SKIP_RETURN_CODE 77
                                                             LABELS "gpu;client;server")
  endif()
  set(chi_gpu_cudart_tests test_gpu test_gpu_coexist test_gpu_device_submit test_gpu_poller_steal
      test_gpu_park test_gpu_peer test_gpu_ll_cycle)
  if(CHI_BUILD_LAB)
    # Measurements, not tests (CHI_BUILD_LAB): gpu_timing reads each route's
    # p50/p99 and throughput (it fails only if a task fails), gpu_breakdown
    # where a round trip's time goes, stage by stage (scripts/gpu-run.sh,
    # lab/journal/gpu-routes.md).
    chi_add_test(gpu_timing SOURCES gpu/gpu_timing.cu GPU TIMEOUT 300 LABELS gpu)
    list(APPEND chi_gpu_cudart_tests gpu_timing)
    add_executable(gpu_breakdown gpu/gpu_breakdown.cu)
    target_link_libraries(gpu_breakdown PRIVATE chimaera::chimaera PkgConfig::CMOCKA Threads::Threads)
    set_target_properties(gpu_breakdown PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
                                                   CUDA_RUNTIME_LIBRARY Static)
  endif()
  foreach(t test_gpu_orchestrator ${chi_gpu_cudart_tests})
    set_target_properties(${t} PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
    target_compile_options(${t} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)
  endforeach()
  foreach(t ${chi_gpu_cudart_tests})
    set_target_properties(${t} PROPERTIES CUDA_RUNTIME_LIBRARY Shared)
    target_link_libraries(${t} PRIVATE CUDA::cudart)
  endforeach()
  set_target_properties(test_gpu_orchestrator PROPERTIES CUDA_RUNTIME_LIBRARY Static)
elseif(CHI_HAVE_HIP)
  # HIP build: the same programs through hipcc (gpu/CMakeLists.txt); without
  # an AMD GPU each exits 77.
  set(chi_hip_gpu_tests test_gpu test_gpu_orchestrator test_gpu_coexist test_gpu_device_submit)
  if(CHI_BUILD_LAB)
    list(APPEND chi_hip_gpu_tests gpu_timing)
  endif()
  foreach(t ${chi_hip_gpu_tests})
    chi_add_test(${t} SOURCES gpu/${t}.cu GPU TIMEOUT 600 LABELS "gpu;hip")
    chi_hip_target(${t})
  endforeach()
  # Compile-only: every device call and the orchestrator macro instantiated.
  add_library(device_api_check OBJECT gpu/device_api_check.cu)
  target_link_libraries(device_api_check PRIVATE chimaera::chimaera)
  chi_hip_target(device_api_check)
endif()

# The orchestrator's grid from the configuration and the SM count (host
# arithmetic, every build).
chi_add_test(test_gpu_shape SOURCES test_gpu_shape.cpp ${PROJECT_SOURCE_DIR}/gpu/shape.cpp
  ${PROJECT_SOURCE_DIR}/src/base/log.cpp TIMEOUT 60 LABELS core)
target_include_directories(test_gpu_shape PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR})
