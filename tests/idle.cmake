# Idle policy of the pollers (src/core/idle_backoff.h, poll_group.h) on the
# CPU: the GPU->CPU pollers use it, and it is tested here without a GPU.
chi_add_test(test_idle SOURCES test_idle.cpp TIMEOUT 120 LABELS core)
target_include_directories(test_idle PRIVATE ${PROJECT_SOURCE_DIR}/src)
# Work stealing between those pollers (src/core/poll_claims.h): claims,
# the stealer's delay, and threads with a blocked poller over a fake ring.
chi_add_test(test_poll_claims SOURCES test_poll_claims.cpp TIMEOUT 240 LABELS core)
target_include_directories(test_poll_claims PRIVATE ${PROJECT_SOURCE_DIR}/src)
# The lease thread's clock offset (src/core/lease_clock.h), simulated clocks.
chi_add_test(test_lease_clock SOURCES test_lease_clock.cpp TIMEOUT 60 LABELS core)
target_include_directories(test_lease_clock PRIVATE ${PROJECT_SOURCE_DIR}/src)
# Parking an idle GPU (src/core/park_gate.h): submitters against a parker,
# every ticket served.
chi_add_test(test_park_gate SOURCES test_park_gate.cpp TIMEOUT 120 LABELS core)
target_include_directories(test_park_gate PRIVATE ${PROJECT_SOURCE_DIR}/src)
