# The server and client mode over shared memory: faults, hostile clients,
# versions and endpoints (test_server.cpp re-executes itself for children).
# The same program runs over each transport ($CHI_TEST_TRANSPORT).
chi_add_test(test_server SOURCES test_server.cpp ${PROJECT_SOURCE_DIR}/src/ipc/frame.cpp TIMEOUT 300
  LABELS server)
target_include_directories(test_server PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(test_server PRIVATE PkgConfig::ZMQ)
foreach(transport ipc tcp)
  add_test(NAME test_server_${transport} COMMAND test_server)
  set_tests_properties(test_server_${transport} PROPERTIES TIMEOUT 300 LABELS server
    ENVIRONMENT "CHI_TEST_TRANSPORT=${transport}")
endforeach()

# Clients that spin and poll (spin_ns, client_yield_ns, the ZeroMQ I/O
# thread awake while results are due) as on machines of 4 CPUs or more,
# whatever this machine has.
foreach(transport shm ipc)
  add_test(NAME test_server_spin_${transport} COMMAND test_server)
  set_tests_properties(test_server_spin_${transport} PROPERTIES TIMEOUT 300 LABELS server
    ENVIRONMENT "CHI_TEST_TRANSPORT=${transport};CHI_CLIENT_SPIN_MIN_CPUS=1")
endforeach()

# Built-in methods on the server's workers instead of its pollers.
add_test(NAME test_server_workers COMMAND test_server)
set_tests_properties(test_server_workers PROPERTIES TIMEOUT 300 LABELS server
  ENVIRONMENT "CHI_SERVER_INLINE_BUILTINS=false")

# Another Unix user cannot reach a server (root only: skipped otherwise).
chi_add_test(test_access SOURCES test_access.c TIMEOUT 120 LABELS server)
