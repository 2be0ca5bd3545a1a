# The soak under chaos (scripts/soak.sh; docs/reliability.md): the server
# module that records every task id it runs in a ledger file, the client that
# submits and logs every outcome, and the checker, built into tests/soak/.
# The full soak is not a ctest test.  soak_smoke (label soak) is a 20 s run
# of the same script, alone (it loads both CPUs); its name keeps it out of the
# sanitizer builds' runs (scripts/test.sh excludes "smoke"); it is skipped
# (77) without jq.
if(TARGET chimaera-server AND TARGET chimaera-ctl)
  set(chi_soak_dir ${CMAKE_CURRENT_SOURCE_DIR}/soak)
  add_library(chi_soak_module MODULE ${chi_soak_dir}/soak_module.c)
  target_link_libraries(chi_soak_module PRIVATE chimaera::chimaera)
  add_executable(soak_client ${chi_soak_dir}/soak_client.c)
  target_link_libraries(soak_client PRIVATE chimaera::chimaera)
  add_executable(soak_check ${chi_soak_dir}/soak_check.c)
  target_link_libraries(soak_check PRIVATE chimaera::chimaera)
  foreach(t chi_soak_module soak_client soak_check)
    target_compile_options(${t} PRIVATE -Wall -Wextra)
    set_target_properties(${t} PROPERTIES
      LIBRARY_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/soak
      RUNTIME_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/soak)
  endforeach()
  find_program(CHI_BASH bash)
  if(CHI_BASH)
    add_test(NAME soak_smoke COMMAND ${CHI_BASH} ${PROJECT_SOURCE_DIR}/scripts/soak.sh
      --seconds 20 --build ${PROJECT_BINARY_DIR} --out ${CMAKE_CURRENT_BINARY_DIR}/soak/smoke)
    set_tests_properties(soak_smoke PROPERTIES
      TIMEOUT 180 SKIP_RETURN_CODE 77 LABELS soak RUN_SERIAL TRUE)
  endif()
endif()
