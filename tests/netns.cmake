# Two nodes on one machine: network namespaces, a veth pair, tcp:// + CURVE,
# the link cut and degraded (tests/netns_tcp.sh; docs/server.md, "Several
# nodes").  Root with CAP_NET_ADMIN only: skipped (77) elsewhere.  Uses the
# soak's module, client and checker (soak.cmake).
if(TARGET chimaera-server AND TARGET chimaera-ctl)
  find_program(CHI_BASH bash)
  if(CHI_BASH)
    add_test(NAME test_netns_tcp COMMAND ${CHI_BASH} ${CMAKE_CURRENT_SOURCE_DIR}/netns_tcp.sh ${PROJECT_BINARY_DIR})
    set_tests_properties(test_netns_tcp PROPERTIES TIMEOUT 180 SKIP_RETURN_CODE 77 LABELS server RUN_SERIAL TRUE)
  endif()
endif()
