#!/bin/sh
# The compiled routing core (PREFIX_ROUTER_COMPILE=1, setup.py) built into build/compiled, once per source:
# cached under a digest of setup.py and the routing package's sources. Prints the directory to put first on
# PYTHONPATH (the whole package, compiled modules beside their sources). Fails if a part was not compiled.
set -eu
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
digest=$(cat setup.py $(find src/prefix_router/routing -name '*.py' -o -name '*.c' | sort) | sha256sum | cut -c1-16)
out=build/compiled/$digest
if [ ! -f "$out/.built" ]; then
    rm -rf build/compiled
    mkdir -p "$out"
    PREFIX_ROUTER_COMPILE=1 PREFIX_ROUTER_COMPILE_STRICT=1 nice -n 10 "$PY" setup.py -q build \
        --build-base "$out/tmp" --build-lib "$out/lib" >"$out/build.log" 2>&1 \
        || { tail -40 "$out/build.log" >&2; exit 1; }
    touch "$out/.built"
fi
echo "$PWD/$out/lib"
