#!/usr/bin/env bash
# The kernel, engine and damaged-file tests against an extension built with AddressSanitizer and
# UndefinedBehaviorSanitizer (CMake option SPARSELLM_SANITIZE; docs/testing.md, "Sanitizers").
# Usage, from anywhere in a checkout, with the test dependencies installed (`pip install
# ".[test]"`, or editable):
#
#   scripts/sanitize.sh                      # build, then tests/kernels tests/engine -m "not slow"
#                                            # and the damaged-file tests of tests/models
#   scripts/sanitize.sh tests/kernels -x     # other pytest arguments instead of the default ones
#
# The package is built out of tree and installed into $SANITIZE_DIR/site (default:
# build/sanitizers/ of the checkout, ignored by git; its CMake build folder is kept there too,
# so a second run only recompiles what changed). Nothing else is touched: the tests import that
# copy through PYTHONPATH (an editable install's import redirection is told to step aside), and
# the script checks that the extension they get is the sanitized one. Any report fails the run:
# ASan stops at its first error, and UBSan's checks abort (-fno-sanitize-recover=all).
# Leak detection is off: CPython does not free everything at exit (interned strings, static
# types, the modules' own caches), so LeakSanitizer would report those at every exit.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${SANITIZE_DIR:-$ROOT/build/sanitizers}"
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"
start=$SECONDS

# Build. Without build isolation when the build requirements are already here (a development
# install; an isolated build gets a new pybind11 path each time, so it recompiles everything);
# otherwise, or with SANITIZE_ISOLATED=1, pip fetches them as it does for `pip install .`.
isolation=()
if [ "${SANITIZE_ISOLATED:-0}" != 1 ] \
   && python -c "import scikit_build_core, pybind11" 2>/dev/null \
   && command -v cmake >/dev/null && command -v ninja >/dev/null; then
  isolation=(--no-build-isolation)
fi
echo "== building the sanitized extension in $WORK"
python -m pip install --quiet --no-deps --upgrade "${isolation[@]}" --target "$WORK/site" \
  -C cmake.define.SPARSELLM_SANITIZE=ON -C install.strip=false -C build-dir="$WORK/cmake" "$ROOT"
NATIVE="$(ls "$WORK"/site/sparsellm/_native*.so)"
echo "built in $((SECONDS - start)) s: $NATIVE"

# The ASan runtime the extension was linked against. It has to be loaded first (before libc's
# malloc is used), and python is not linked with it, hence LD_PRELOAD. libstdc++ right after
# it: ASan resolves its C++ exception interceptor (__cxa_throw) when it starts, and python
# itself does not load libstdc++, so the first exception thrown in the extension (a refused
# argument becoming a Python ValueError) would stop the process with "CHECK failed:
# asan_interceptors.cpp ... real___cxa_throw".
LIBASAN="$(ldd "$NATIVE" | awk '/libasan/ {print $3}')"
LIBSTDCXX="$(ldd "$NATIVE" | awk '/libstdc\+\+/ {print $3}')"
for lib in "$LIBASAN" "$LIBSTDCXX"; do
  [ -f "$lib" ] || {
    echo "ldd does not name libasan and libstdc++ for $NATIVE:" >&2; ldd "$NATIVE" >&2; exit 2; }
done

# An editable scikit-build-core install redirects `import sparsellm` to its checkout ahead of
# sys.path; its finder steps aside for the build folder named here.
EDITABLE_SKIP="$(python -c '
import sys
print(":".join(getattr(f, "path", "") or "" for f in sys.meta_path
               if type(f).__name__.startswith("ScikitBuild")))')"

export LD_PRELOAD="$LIBASAN:$LIBSTDCXX${LD_PRELOAD:+:$LD_PRELOAD}"
export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
export SKBUILD_EDITABLE_SKIP="$EDITABLE_SKIP"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:halt_on_error=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"

got="$(cd "$ROOT" && python -c 'import sparsellm._native as n; print(n.__file__)')"
[ "$got" -ef "$NATIVE" ] || { echo "the tests would import $got, not $NATIVE" >&2; exit 2; }

echo "== LD_PRELOAD=$LD_PRELOAD"
tests_start=$SECONDS
status=0
# --capture=sys: a report is written to file descriptor 2 by a process that then exits; pytest's
# default capture (of the descriptors) would swallow it with the process.
run() { (cd "$ROOT" && python -m pytest -p no:cacheprovider --capture=sys "$@") || status=$?; }
if [ $# -gt 0 ]; then
  run "$@"
else
  run tests/kernels tests/engine -m "not slow"
  # The damaged-file tests (slow-marked, about a minute here): every case that loads runs a
  # prompt through the native engine, with shapes, offsets and alignments no valid file has.
  run tests/models/test_damaged_gguf.py tests/models/test_damaged_safetensors.py \
      tests/models/test_damaged_compressed.py
fi
echo "tests took $((SECONDS - tests_start)) s; build and tests $((SECONDS - start)) s"
exit $status
