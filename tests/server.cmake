# The example module (examples/module) in a chimaera-server used by a client
# process: lookups, submits from threads, a killed server, failing modules.
# Needs the server (CHI_BUILD_TOOLS) and the example (CHI_BUILD_EXAMPLES).
if(TARGET chimaera-server AND CHI_BUILD_EXAMPLES)
  chi_add_test(test_module_server SOURCES test_module_server.c TIMEOUT 300 LABELS server)
  # The module targets are defined later (examples/, core.cmake): their
  # paths resolve when the build is generated.
  add_dependencies(test_module_server chimaera-server chi_example_module chi_test_module_fail)
  target_compile_definitions(test_module_server PRIVATE
    CHI_SERVER_PATH="$<TARGET_FILE:chimaera-server>"
    EXAMPLE_MODULE_PATH="$<TARGET_FILE:chi_example_module>"
    FAIL_MODULE_PATH="$<TARGET_FILE:chi_test_module_fail>")
  if(CHI_SANITIZE STREQUAL "thread")
    set_tests_properties(test_module_server PROPERTIES ENVIRONMENT "CHI_TEST_SCALE=0.5")
  endif()
  # The module's GPU handler through the server (exit 77 without a GPU).
  if(CHI_HAVE_CUDA)
    add_test(NAME test_module_server_gpu COMMAND test_module_server --gpu)
    set_tests_properties(test_module_server_gpu PROPERTIES
      TIMEOUT 300 SKIP_RETURN_CODE 77 LABELS "server;gpu")
  endif()
endif()

# 200 graceful stops in a row under load, on each transport (test_server's
# test_stop_under_load; 6-9 s each on the 2-core machine): not in the default
# run.  cmake -DCHI_LONG_TESTS=ON, then ctest -L long.
option(CHI_LONG_TESTS "Register the long server tests (label long)" OFF)
if(CHI_LONG_TESTS)
  foreach(transport shm ipc tcp)
    add_test(NAME test_server_stops_${transport} COMMAND test_server)
    set_tests_properties(test_server_stops_${transport} PROPERTIES TIMEOUT 900 LABELS "server;long" RUN_SERIAL TRUE
      ENVIRONMENT "CHI_TEST_TRANSPORT=${transport};CHI_TEST_STOPS=200;CHI_TEST_FILTER=test_stop_under_load")
  endforeach()
endif()

# Several --listen addresses make one server, whose status lists them all.
if(TARGET chimaera-server AND TARGET chimaera-ctl)
  add_test(NAME test_server_listen COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/server_listen.sh
    $<TARGET_FILE:chimaera-server> $<TARGET_FILE:chimaera-ctl>)
  set_tests_properties(test_server_listen PROPERTIES TIMEOUT 60 LABELS server)
endif()

# Stateful protocol fuzzing (test_protocol_sequences): random frame sequences
# per connection against a real ZeroMQ listener, invariants checked after
# each; the default runs above do 20 sequences, these 500 (a count, not a time).
foreach(transport ipc tcp)
  add_test(NAME test_server_sequences_${transport} COMMAND test_server)
  set_tests_properties(test_server_sequences_${transport} PROPERTIES TIMEOUT 300 LABELS server
    ENVIRONMENT "CHI_TEST_TRANSPORT=${transport};CHI_TEST_FILTER=test_protocol_sequences;CHI_TEST_SEQUENCES=500")
endforeach()

# The same over shm:// (test_shm_sequences): raw peers drive the session
# socket and the segment's ring; 20 sequences in the default test_server run,
# 500 here, and 200 with the built-ins on workers (CHI_TEST_WORKERS=1).
add_test(NAME test_server_sequences_shm COMMAND test_server)
set_tests_properties(test_server_sequences_shm PROPERTIES TIMEOUT 300 LABELS server
  ENVIRONMENT "CHI_TEST_TRANSPORT=shm;CHI_TEST_FILTER=test_shm_sequences;CHI_TEST_SEQUENCES=500")
add_test(NAME test_server_sequences_shm_workers COMMAND test_server)
set_tests_properties(test_server_sequences_shm_workers PROPERTIES TIMEOUT 300 LABELS server
  ENVIRONMENT "CHI_TEST_TRANSPORT=shm;CHI_TEST_FILTER=test_shm_sequences;CHI_TEST_SEQUENCES=200;CHI_TEST_WORKERS=1")
