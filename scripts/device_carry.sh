#!/usr/bin/env bash
# Prepares .device-carry/ for a GPU run (see shared/device/README.md), minus Debian's libcap2:
# the GPU image already has it, and unpacking Debian 12's copy into / turns the image's /lib symlink
# into a real folder, after which ld cannot find /lib/x86_64-linux-gnu/libm.so.6 and every build fails.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
"$root/../shared/device/carry.sh" pydantic-settings "$@"
rm -f "$root"/.device-carry/deb/libcap2_*.deb
