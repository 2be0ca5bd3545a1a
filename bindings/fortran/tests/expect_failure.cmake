# cmake -DPROGRAM=... -DARGS=... -DPATTERN=... -P expect_failure.cmake
# Passes when PROGRAM exits non-zero and its output matches PATTERN.
execute_process(COMMAND ${PROGRAM} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "expected a failure, got exit status 0:\n${all}")
endif()
if(NOT all MATCHES "${PATTERN}")
  message(FATAL_ERROR "exit status ${rc}, but the output does not match '${PATTERN}':\n${all}")
endif()
message(STATUS "failed as expected (exit status ${rc}):\n${all}")
