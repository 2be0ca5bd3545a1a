# Core runtime on CPU routes, and the install-consumer test.

chi_add_test(test_api SOURCES test_api.c TIMEOUT 120 LABELS core)
chi_add_test(test_batch SOURCES test_batch.c TIMEOUT 120 LABELS core)
chi_add_test(test_concurrency SOURCES test_concurrency.c TIMEOUT 300 LABELS core)
chi_add_test(test_finalize SOURCES test_finalize.c TIMEOUT 120 LABELS core)
chi_add_test(test_memory SOURCES test_memory.c TIMEOUT 120 LABELS core)
chi_add_test(test_modules SOURCES test_modules.c TIMEOUT 120 LABELS core)

# The sample module, built three ways from one file (see module_sample.c).
foreach(variant sample nosym fail)
  add_library(chi_test_module_${variant} MODULE module_sample.c)
  target_link_libraries(chi_test_module_${variant} PRIVATE chimaera::chimaera)
  add_dependencies(test_modules chi_test_module_${variant})
endforeach()
target_compile_definitions(chi_test_module_nosym PRIVATE SAMPLE_NO_INIT)
target_compile_definitions(chi_test_module_fail PRIVATE SAMPLE_INIT_FAILS)
target_compile_definitions(test_modules PRIVATE
  SAMPLE_MODULE_PATH="$<TARGET_FILE:chi_test_module_sample>"
  SAMPLE_NOSYM_PATH="$<TARGET_FILE:chi_test_module_nosym>"
  SAMPLE_FAIL_PATH="$<TARGET_FILE:chi_test_module_fail>")

# ThreadSanitizer slows the threaded programs down about tenfold: fewer
# iterations keep them at seconds.  ASan+UBSan runs them at full size.
set(chi_core_tests test_api test_batch test_concurrency test_finalize test_memory test_modules)
set(chi_consumer_flags "")
if(CHI_SANITIZE STREQUAL "thread")
  set_tests_properties(${chi_core_tests} PROPERTIES ENVIRONMENT "CHI_TEST_SCALE=0.5")
  set(chi_consumer_flags "-fsanitize=thread")
elseif(CHI_SANITIZE STREQUAL "address")
  set(chi_consumer_flags "-fsanitize=address,undefined")
endif()

# A program run again under a setting: NAME_SUFFIX with ENV set (and the
# sanitizer's scale), the same timeout and label.
function(chi_setting_variant suffix env)
  foreach(t ${ARGN})
    add_test(NAME ${t}_${suffix} COMMAND ${t})
    get_test_property(${t} TIMEOUT chi_timeout)
    set(chi_env "${env}")
    if(CHI_SANITIZE STREQUAL "thread")
      list(APPEND chi_env "CHI_TEST_SCALE=0.5")
    endif()
    set_tests_properties(${t}_${suffix} PROPERTIES TIMEOUT ${chi_timeout} LABELS core ENVIRONMENT "${chi_env}")
  endforeach()
endfunction()
# Workers taking up to 4 tasks of a shared queue at once (worker_pop_batch;
# the default on 16+ CPUs, 1 on CI's 2).
chi_setting_variant(pop_batch "CHI_WORKER_POP_BATCH=4" test_api test_batch test_concurrency)
# Four spinning workers (worker_spinners; CI's 2 CPUs give one by default),
# so that the storms pass the watch between spinners.
chi_setting_variant(spinners "CHI_WORKER_SPINNERS=4" test_batch test_concurrency)
# Waiters that run their thread's queued tasks (inline_wait): the storms,
# nested submits and racing waiters with tasks run on application threads.
chi_setting_variant(inline_wait "CHI_INLINE_WAIT=true" test_api test_batch test_concurrency)

add_test(NAME test_install
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/install/run_install_test.sh
    ${PROJECT_BINARY_DIR} ${CMAKE_CURRENT_BINARY_DIR}/install-test
    ${CMAKE_C_COMPILER} ${CMAKE_CXX_COMPILER} ${CMAKE_COMMAND} "${CMAKE_GENERATOR}"
    "${chi_consumer_flags}")
set_tests_properties(test_install PROPERTIES TIMEOUT 300 LABELS install)

# The same programs in client mode, each against its own chimaera-server
# (run_with_server.sh); cases that only make sense in an embedded runtime
# skip themselves when CHI_MODE=client.
if(TARGET chimaera-server AND TARGET chimaera-ctl)
  foreach(t ${chi_core_tests})
    add_test(NAME ${t}_client
      COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/run_with_server.sh
        $<TARGET_FILE:chimaera-server> $<TARGET_FILE:chimaera-ctl> $<TARGET_FILE:${t}>)
    get_test_property(${t} TIMEOUT chi_timeout)
    set_tests_properties(${t}_client PROPERTIES
      TIMEOUT ${chi_timeout} SKIP_RETURN_CODE 77 LABELS "core;server")
    if(CHI_SANITIZE STREQUAL "thread")
      set_tests_properties(${t}_client PROPERTIES ENVIRONMENT "CHI_TEST_SCALE=0.5")
    endif()
  endforeach()
endif()

# server.mps's daemon handling without a GPU (src/core/mps.h): refusals,
# reuse of a daemon that answers, a client's adopt, and with the test program
# as a stand-in nvidia-cuda-mps-control: a failed start, a daemon that never
# answers, start, sharing and quit, a quit that hangs, a stale marker.
# Compiles its sources itself: their symbols are internal to the library.
chi_add_test(test_mps SOURCES test_mps.cpp ${PROJECT_SOURCE_DIR}/src/core/mps.cpp
  ${PROJECT_SOURCE_DIR}/src/base/error.cpp ${PROJECT_SOURCE_DIR}/src/base/log.cpp TIMEOUT 60 LABELS core)
target_include_directories(test_mps PRIVATE ${PROJECT_SOURCE_DIR}/src)
