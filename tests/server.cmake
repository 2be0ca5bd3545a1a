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
