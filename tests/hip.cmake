# HIP backend (-DCHI_ENABLE_HIP=ON): without an AMD GPU the library answers
# CHI_ERR_NO_DEVICE (test_hip_backend; skipped where a GPU is found).  The GPU
# test programs and examples of the HIP build are in tests/gpu.cmake and
# examples/cuda.  scripts/test.sh builds this tree with scripts/hip-check.sh.
if(CHI_HAVE_HIP)
  chi_add_test(test_hip_backend SOURCES test_hip_backend.c LABELS hip)
endif()
