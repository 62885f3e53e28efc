#!/bin/sh
# The C++ compiler that extension builds in the sandbox call (CXX): the real one, given the precompiled
# torch/extension.h (kernelloop.tools.header_cache) for a source that begins by including it. GCC checks
# that the precompiled header was made with compatible options and otherwise parses the header as usual.
real="${KERNELLOOP_REAL_CXX:-c++}"
header="$KERNELLOOP_TORCH_HEADER"
if [ -n "$header" ] && [ -d "$header.gch" ]; then
    for arg in "$@"; do
        case "$arg" in
        *.cpp | *.cc | *.cxx)
            if [ -f "$arg" ] && [ "$(grep -m1 -v '^[[:space:]]*$' "$arg")" = "#include <torch/extension.h>" ]; then
                exec "$real" -include "$header" "$@"
            fi
            ;;
        esac
    done
fi
exec "$real" "$@"
