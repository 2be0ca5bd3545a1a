# The soak under chaos (scripts/soak.sh; docs/reliability.md): the server
# module that records every task id it runs in a ledger file, the client that
# submits and logs every outcome, and the checker, built into tests/soak/.
# The full soak is not a ctest test.  soak_smoke (label soak) is a 20 s run
# of the same script without GPU routes, alone (it loads both CPUs); its name
# keeps it out of the sanitizer builds' runs (scripts/test.sh excludes
# "smoke"); it is skipped (77) without jq.
# CUDA builds add the GPU handler of soak.record to the module
# (soak_module_gpu.cu) and soak_gpu (soak_gpu.cu), the embedded program whose
# kernels submit GPU->CPU and GPU->GPU tasks for scripts/soak.sh --gpu;
# soak_gpu_smoke runs it for a few seconds (exit 77, skipped, without a GPU).
if(TARGET chimaera-server AND TARGET chimaera-ctl)
  set(chi_soak_dir ${CMAKE_CURRENT_SOURCE_DIR}/soak)
  add_library(chi_soak_module MODULE ${chi_soak_dir}/soak_module.c)
  target_link_libraries(chi_soak_module PRIVATE chimaera::chimaera)
  if(CHI_HAVE_CUDA)
    target_sources(chi_soak_module PRIVATE ${chi_soak_dir}/soak_module_gpu.cu)
    target_compile_definitions(chi_soak_module PRIVATE SOAK_MODULE_GPU)
    # The shared CUDA runtime, as the library: one cudart per process.
    set_target_properties(chi_soak_module PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
      CUDA_RUNTIME_LIBRARY Shared C_VISIBILITY_PRESET hidden CUDA_VISIBILITY_PRESET hidden)
    target_link_libraries(chi_soak_module PRIVATE CUDA::cudart)
    add_executable(soak_gpu ${chi_soak_dir}/soak_gpu.cu)
    target_link_libraries(soak_gpu PRIVATE chimaera::chimaera PkgConfig::CMOCKA Threads::Threads CUDA::cudart)
    set_target_properties(soak_gpu PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
      CUDA_RUNTIME_LIBRARY Shared RUNTIME_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/soak)
    target_compile_options(soak_gpu PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)
    add_dependencies(soak_gpu chi_soak_module)
    add_test(NAME soak_gpu_smoke COMMAND soak_gpu --smoke 5
      --module $<TARGET_FILE:chi_soak_module> --dir ${CMAKE_CURRENT_BINARY_DIR}/soak/gpu-smoke)
    set_tests_properties(soak_gpu_smoke PROPERTIES
      TIMEOUT 120 SKIP_RETURN_CODE 77 LABELS "soak;gpu" RUN_SERIAL TRUE)
  endif()
  add_executable(soak_client ${chi_soak_dir}/soak_client.c)
  target_link_libraries(soak_client PRIVATE chimaera::chimaera)
  add_executable(soak_check ${chi_soak_dir}/soak_check.c)
  target_link_libraries(soak_check PRIVATE chimaera::chimaera)
  foreach(t chi_soak_module soak_client soak_check)
    target_compile_options(${t} PRIVATE $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra>)
    set_target_properties(${t} PROPERTIES
      LIBRARY_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/soak
      RUNTIME_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/soak)
  endforeach()
  find_program(CHI_BASH bash)
  if(CHI_BASH)
    add_test(NAME soak_smoke COMMAND ${CHI_BASH} ${PROJECT_SOURCE_DIR}/scripts/soak.sh
      --seconds 20 --gpu off --build ${PROJECT_BINARY_DIR} --out ${CMAKE_CURRENT_BINARY_DIR}/soak/smoke)
    set_tests_properties(soak_smoke PROPERTIES
      TIMEOUT 180 SKIP_RETURN_CODE 77 LABELS soak RUN_SERIAL TRUE)
  endif()
endif()
