# Limits a new user meets: method ids across runtimes, deep queues with the
# default configuration, chi_config_t.settings, worker stack size.
chi_add_test(test_limits SOURCES test_limits.c TIMEOUT 300 LABELS core)
if(CHI_SANITIZE STREQUAL "thread")
  set_tests_properties(test_limits PROPERTIES ENVIRONMENT "CHI_TEST_SCALE=0.5")
endif()
