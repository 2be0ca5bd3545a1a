# The CPU pool's lock-free free-slot shards and run queue (src/core), on
# their own.
chi_add_test(test_queues SOURCES test_queues.cpp TIMEOUT 120 LABELS core)
target_include_directories(test_queues PRIVATE ${PROJECT_SOURCE_DIR}/src)
