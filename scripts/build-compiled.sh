#!/bin/sh
# The compiled build (COMPILE_ROUTING_CORE=1, setup.py: the routing core and the proxy's request path), into
# build/compiled, once per source: cached under a digest of setup.py and the sources it compiles. Prints
# the directory to put first on PYTHONPATH (the whole package, compiled modules beside their sources, the
# uncompiled modules always the tree's current ones). Fails if a part was not compiled.
set -eu
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
# one call at a time (pytest's workers may each ask for the build): the refresh below rewrites the package
mkdir -p build
exec 9>build/compiled.lock
flock 9
compiled=$("$PY" -c 'import setup; print(" ".join(setup.COMPILED))')  # what setup.py compiles
digest=$(cat setup.py $compiled $(find src/prefix_router/routing -name '*.c' | sort) | sha256sum | cut -c1-16)
out=build/compiled/$digest
if [ ! -f "$out/.built" ]; then
    rm -rf build/compiled
    mkdir -p "$out"
    COMPILE_ROUTING_CORE=1 COMPILE_ROUTING_CORE_STRICT=1 nice -n 10 "$PY" setup.py -q build \
        --build-base "$out/tmp" --build-lib "$out/lib" >"$out/build.log" 2>&1 \
        || { tail -40 "$out/build.log" >&2; exit 1; }
    touch "$out/.built"
fi
# the rest of the package (the proxy, the lab, ...) is the tree's as it is now, refreshed on every call: the
# cache is keyed by what is compiled only, and a package dir with a stale edge would run old proxy code
tar -C src --exclude=__pycache__ -cf - prefix_router | tar -C "$out/lib" -xf -
echo "$PWD/$out/lib"
