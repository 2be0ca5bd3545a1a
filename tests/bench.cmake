# chimaera-bench's options (the benchmark itself measures, it is not a test).
if(TARGET chimaera-bench)
  add_test(NAME test_bench_rows COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/bench_rows.sh $<TARGET_FILE:chimaera-bench>)
  set_tests_properties(test_bench_rows PROPERTIES TIMEOUT 120 LABELS core)
endif()
