# The security review's attacks replayed against a real server (ctest -L
# security): tests/security/test_security.cpp.  The `squat` run switches to
# other uids (root only; skipped otherwise).
if(TARGET chimaera-ctl)
  chi_add_test(test_security SOURCES security/test_security.cpp ${PROJECT_SOURCE_DIR}/src/ipc/frame.cpp
    TIMEOUT 300 LABELS "security;server")
  target_include_directories(test_security PRIVATE ${PROJECT_SOURCE_DIR}/src ${CMAKE_CURRENT_SOURCE_DIR})
  target_link_libraries(test_security PRIVATE PkgConfig::ZMQ)
  target_compile_definitions(test_security PRIVATE CHI_CTL_PATH="$<TARGET_FILE:chimaera-ctl>")
  add_dependencies(test_security chimaera-ctl)
  add_test(NAME test_security_squat COMMAND test_security squat)
  set_tests_properties(test_security_squat PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77 LABELS "security;server")
  # Build-tree tools must not search the current folder for libraries.
  add_test(NAME test_security_runpath
    COMMAND ${CMAKE_COMMAND} "-DFILES=$<TARGET_FILE:chimaera-server>;$<TARGET_FILE:chimaera-ctl>;$<TARGET_FILE:chimaera-bench>;$<TARGET_FILE:chimaera-demo>"
      -P ${CMAKE_CURRENT_SOURCE_DIR}/security/runpath.cmake)
  set_tests_properties(test_security_runpath PROPERTIES TIMEOUT 60 LABELS security)
endif()
