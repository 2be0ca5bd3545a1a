# chi_stats of the CPU route: exact counts, sampled latency.
chi_add_test(test_stats SOURCES test_stats.c TIMEOUT 120 LABELS core)
