#!/usr/bin/env bash
# Quick start, command 1: install what the library needs, build chimaera-demo
# (and the library under it, nothing else), run the embedded demo.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CHI_SETUP=demo source "$here/setup.sh"
"$build/src/tools/chimaera-demo" "$@"
