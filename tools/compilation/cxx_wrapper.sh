#!/bin/sh
# The C++ compiler that extension builds in the sandbox call (CXX): the real one, with two shortcuts.
#
# Precompiled torch/extension.h (kernelloop.tools.compilation.header_cache): a source that begins by including it gets
# `-include` of the precompiled header; GCC checks that it was made with compatible options and otherwise
# parses the header as usual.
#
# Objects of unchanged sources (kernelloop.tools.compilation.object_cache): a compile of one C++ source to an object is
# preprocessed first; the key is the options and that text. When the host's cache (read-only here) holds the
# key, its object is copied and nothing is compiled. Otherwise the source compiles as usual and, if it did,
# the text and the options are left in the build for the host, which compiles them in a sandbox of its own.
real="${KERNELLOOP_REAL_CXX:-c++}"
header="$KERNELLOOP_TORCH_HEADER"
objects="$KERNELLOOP_OBJECTS"
requests="$KERNELLOOP_OBJECT_REQUESTS"

source="" out="" compile="" cacheable=1 skip="" prev=""
for arg do
    shift
    if [ -n "$skip" ]; then skip=""; out="$arg"; prev="$arg"; continue; fi
    case "$arg" in
    -o) skip=1; prev="$arg"; continue ;;
    -c) compile=1; prev="$arg"; continue ;;
    -E | -S | -M | -MM | @*) cacheable="" ;;
    *.cpp | *.cc | *.cxx) case "$prev" in -MF | -MQ | -MT | -include | -x) ;; *) source="$arg" ;; esac ;;
    esac
    case "$arg" in *"
"*) cacheable="" ;; esac
    set -- "$@" "$arg"
    prev="$arg"
done
# "$@" is now the command less -c and -o OUT: the options the key covers

pch=""
if [ -n "$header" ] && [ -d "$header.gch" ] && [ -n "$source" ] && [ -f "$source" ] &&
    [ "$(grep -m1 -v '^[[:space:]]*$' "$source")" = "#include <torch/extension.h>" ]; then
    pch="-include $header"
fi

compile_it() {
    if [ -n "$compile" ]; then set -- "$@" -c; fi
    if [ -n "$out" ]; then set -- "$@" -o "$out"; fi
    # shellcheck disable=SC2086 # $pch is empty or two words
    "$real" $pch "$@"
}

# only the build's own sources (not nvcc's intermediate files in /tmp), compiled to an object
case "$source" in "${requests%/*}"/*) ;; *) cacheable="" ;; esac
if [ -z "$objects" ] || [ -z "$requests" ] || [ -z "$compile" ] || [ -z "$source" ] || [ -z "$cacheable" ] ||
    [ -n "$skip" ] || [ "${out%.o}" = "$out" ]; then
    compile_it "$@"
    exit $?
fi

text="$out.preprocessed.ii"
if ! "$real" "$@" -E -P -MQ "$out" -o "$text" 2>/dev/null; then
    rm -f "$text"
    compile_it "$@"
    exit $?
fi
key=$({ printf '%s\n' "$#"; printf '%s\n' "$@"; cat "$text"; } | sha256sum | cut -c1-64)
if [ -f "$objects/$key.o" ] && cp "$objects/$key.o" "$out"; then
    rm -f "$text"
    exit 0
fi
compile_it "$@"
status=$?
if [ "$status" -eq 0 ] && mkdir -p "$requests"; then
    { printf '%s\n' "$#"; printf '%s\n' "$@"; } >"$requests/$key.args" && mv "$text" "$requests/$key.ii"
fi
rm -f "$text"
exit "$status"
