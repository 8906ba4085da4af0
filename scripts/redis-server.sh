#!/bin/sh
# Make sure redis-server is installed (the shared-state tests start their own on a free loopback port).
# Usage: scripts/redis-server.sh ensure     (installs the Debian package redis-server when missing, as root)
#        scripts/redis-server.sh run PORT   (foreground, loopback only, no persistence; for trying things out)
set -eu
case "${1:-ensure}" in
  ensure)
    if command -v redis-server >/dev/null 2>&1; then
      redis-server --version
      exit 0
    fi
    if [ "$(id -u)" != 0 ]; then
      echo "redis-server is missing: install the Debian package redis-server (as root)" >&2
      exit 1
    fi
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
    redis-server --version
    ;;
  run)
    exec redis-server --port "${2:-6379}" --bind 127.0.0.1 --save '' --appendonly no
    ;;
  *)
    echo "usage: $0 ensure | run [PORT]" >&2
    exit 2
    ;;
esac
