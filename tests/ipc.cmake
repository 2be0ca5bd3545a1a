# The wire in one process (src/ipc): frames, session socket messages with
# passed descriptors, the segment ring across its wrap, the handshake checks,
# the address schemes.
# Compiles the ipc and base sources itself: their symbols are internal to
# the library.
chi_add_test(test_ipc SOURCES test_ipc.cpp
  ${PROJECT_SOURCE_DIR}/src/ipc/frame.cpp ${PROJECT_SOURCE_DIR}/src/ipc/channel.cpp
  ${PROJECT_SOURCE_DIR}/src/ipc/handshake.cpp ${PROJECT_SOURCE_DIR}/src/ipc/address.cpp
  ${PROJECT_SOURCE_DIR}/src/base/error.cpp
  ${PROJECT_SOURCE_DIR}/src/base/log.cpp
  TIMEOUT 60)
target_include_directories(test_ipc PRIVATE ${PROJECT_SOURCE_DIR}/src)
