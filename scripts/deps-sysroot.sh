# deps-sysroot.sh: sourced (from the project root) by the scripts that
# configure their own builds on the GPU machine or here (gpu-cpu-ab.sh,
# gpu-cpu-trace.sh).  Sets `sysroot`, the PKG_CONFIG_SYSROOT_DIR for their
# cmake configure: on the GPU machine the Debian libraries are unpacked under
# /opt/deps (scripts/gpu-deps.sh, sourced here when pkg-config finds no
# libzmq and .devdeps is there) and their .pc files name /usr, so pkg-config
# must prefix them; elsewhere it stays as the caller's environment has it.
sysroot=${PKG_CONFIG_SYSROOT_DIR:-}
if ! pkg-config --exists libzmq 2>/dev/null && [ -f scripts/gpu-deps.sh ] && [ -d .devdeps ]; then
  . scripts/gpu-deps.sh >/dev/null 2>&1
  sysroot=/opt/deps
fi
# A caller that sourced gpu-deps.sh already (gpu-pending.sh) leaves pkg-config
# finding libzmq under /opt/deps: the prefix is needed all the same.
case ":${PKG_CONFIG_PATH:-}:" in *:/opt/deps/*) sysroot=/opt/deps ;; esac
