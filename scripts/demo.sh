#!/usr/bin/env bash
# Quick start, command 1: set up, build, run the embedded demo.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/setup.sh"
"$build/src/tools/chimaera-demo" "$@"
