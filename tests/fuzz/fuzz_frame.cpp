// The ZeroMQ frame decoder (ipc/frame.h) over arbitrary bytes: it must never
// read past the input, and what it accepts must re-encode to the same bytes.
#include <cstdlib>
#include <cstring>
#include <string>

#include "ipc/frame.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  chi::ipc::Frame f;
  std::string why;
  if (chi::ipc::decode_frame(data, size, &f, &why) != CHI_OK) {
    if (why.empty()) abort();  // every refusal says why
    return 0;
  }
  std::string again;
  chi::ipc::encode_frame(f, &again);
  if (again.size() != size || std::memcmp(again.data(), data, size) != 0) abort();
  return 0;
}
