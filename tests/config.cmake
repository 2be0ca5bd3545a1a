# Configuration: chimaera.yaml parsing and errors, CHI_* overrides, chi_config_t.
chi_add_test(test_config SOURCES test_config.c TIMEOUT 120 LABELS config)
# The test loads the repository's example file as-is.
target_compile_definitions(test_config PRIVATE
  CHI_EXAMPLE_CONFIG="${PROJECT_SOURCE_DIR}/chimaera.yaml")
