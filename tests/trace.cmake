# The round-trip trace (src/core/trace.h): only in a -DCHI_TRACE=ON build,
# which scripts/test.sh makes (the cpu-trace preset).
if(CHI_TRACE)
  chi_add_test(test_trace SOURCES test_trace.c TIMEOUT 60 LABELS trace)
endif()
