# gpu-deps.sh: sourced by the scripts the GPU machine runs (Ubuntu 24.04,
# CUDA 13, no network, none of our Debian libraries).  Unpacks the .deb files
# that ../shared/tools/gpu-machine-deps put in .devdeps/ into /opt/deps and
# points the build and the loader at them and at CUDA.  Run from the project root.
mkdir -p /opt/deps
for f in .devdeps/*.deb; do dpkg -x "$f" /opt/deps; done
# libzmq.pc names Requires.private packages (krb5, pgm, norm, bsd) whose .pc
# files are not unpacked here; only the shared library is linked, so drop them.
sed -i '/^Requires.private/d' /opt/deps/usr/lib/x86_64-linux-gnu/pkgconfig/libzmq.pc 2>/dev/null || true
export CMAKE_PREFIX_PATH=/opt/deps/usr
export PKG_CONFIG_PATH=/opt/deps/usr/lib/x86_64-linux-gnu/pkgconfig:/opt/deps/usr/share/pkgconfig
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
