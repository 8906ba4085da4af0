#!/bin/sh
# Reinstall the pinned opentelemetry-proto (the otel extra's) over xds-protos' copy of its modules.
# xds-protos (Envoy's generated modules, a base dependency of the endpoint picker) ships an old
# opentelemetry/proto/... under the same paths, and pip installs it after opentelemetry-proto (the deeper
# dependency goes first), so its copy wins and the OTLP exporters fail to import (no InstrumentationScope).
# Envoy's modules import with the current copy too. Run after every install of the otel extra (make does).
# Usage: scripts/otel-protos.sh [PIP]   (PIP: the environment's pip, pip by default)
set -eu
pin=$(grep -o '"opentelemetry-proto==[^"]*"' "$(dirname "$0")/../pyproject.toml" | tr -d '"')
"${1:-pip}" install --quiet --no-deps --force-reinstall --no-compile "$pin"
