# Compile-check of the device header and gpu/ sources for an AMD target with
# Debian's hipcc (nothing runs); skipped (77) where hipcc is not installed.
add_test(NAME hip_compile_check COMMAND ${PROJECT_SOURCE_DIR}/scripts/hip-check.sh)
set_tests_properties(hip_compile_check PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77 LABELS hip)
