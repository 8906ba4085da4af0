#!/bin/sh
# Make sure Debian's chromium and chromium-driver are installed (the dashboard's browser tests drive the
# system browser through /usr/bin/chromedriver with selenium; nothing is downloaded by selenium itself).
# Usage: scripts/chromium.sh ensure     (installs the Debian packages when missing, as root)
set -eu
case "${1:-ensure}" in
  ensure)
    if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
      /usr/bin/chromedriver --version
      exit 0
    fi
    if [ "$(id -u)" != 0 ]; then
      echo "chromium or chromedriver is missing: install the Debian packages chromium and chromium-driver (as root)" >&2
      exit 1
    fi
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
    /usr/bin/chromedriver --version
    ;;
  *)
    echo "usage: $0 ensure" >&2
    exit 2
    ;;
esac
