# The relay behind client kernels without a GPU (CHI_RELAY_HOST_MEMORY=1:
# the test plays the kernel's part on the ring).  Built where the library
# has a GPU backend: the relay lives in gpu/.
if(CHI_HAVE_CUDA OR CHI_HAVE_HIP)
  chi_add_test(test_client_relay SOURCES test_client_relay.cpp TIMEOUT 120 LABELS "client;server")
  target_include_directories(test_client_relay PRIVATE ${PROJECT_SOURCE_DIR})
endif()
