// The YAML configuration loader over arbitrary text: it answers CHI_OK or
// CHI_ERR_CONFIG with a message, never crashes, never hangs.
#include <cstdlib>
#include <string>

#include "config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string text(reinterpret_cast<const char *>(data), size);
  chi::Config cfg;
  std::string error;
  chi_status_t s = chi::parse_config_text(text, "fuzz.yaml", &cfg, &error);
  if (s != CHI_OK && (s != CHI_ERR_CONFIG || error.empty())) abort();
  return 0;
}
