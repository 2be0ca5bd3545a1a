// The ZeroMQ frame decoder (ipc/frame.h) over arbitrary bytes, as one frame
// and as a batch of frames: it must never read past the input, and what it
// accepts must re-encode to the same bytes.
#include <cstdlib>
#include <cstring>
#include <string>

#include "ipc/frame.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  chi::ipc::Frame f;
  std::string why;
  if (chi::ipc::decode_frame(data, size, &f, &why) == CHI_OK) {
    std::string again;
    chi::ipc::encode_frame(f, &again);
    if (again.size() != size || std::memcmp(again.data(), data, size) != 0) abort();
  } else if (why.empty()) {
    abort();  // every refusal says why
  }
  // The same bytes as a batch (how both ends read a message part): frame
  // after frame, each within what is left; the accepted prefix re-encodes
  // to the same bytes.
  std::string again;
  size_t off = 0;
  while (off < size) {
    size_t used = 0;
    why.clear();
    if (chi::ipc::decode_next_frame(data + off, size - off, &f, &used, &why) != CHI_OK) {
      if (why.empty()) abort();
      break;
    }
    if (used < chi::ipc::kFrameHeader || used > size - off) abort();
    chi::ipc::append_frame(f, &again);
    off += used;
  }
  if (again.size() != off || std::memcmp(again.data(), data, off) != 0) abort();
  return 0;
}
