# The server and client mode over shared memory: faults, hostile clients,
# versions and endpoints (test_server.cpp re-executes itself for children).
chi_add_test(test_server SOURCES test_server.cpp TIMEOUT 300 LABELS server)
target_include_directories(test_server PRIVATE ${PROJECT_SOURCE_DIR}/src)
