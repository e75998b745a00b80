#!/usr/bin/env bash
# Browser test of an HTML report (issue 7's acceptance).
#   tests/browser/run.sh REPORT.html EXPECTED_SITE OUT.png
# Installs what it needs: Debian's chromium (apt) when missing, playwright-core
# (npm ci, from package-lock.json). $CHROMIUM overrides the browser path.
set -euo pipefail
if [ $# -ne 3 ]; then
  echo "usage: $0 REPORT.html EXPECTED_SITE OUT.png" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
export CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
if [ ! -x "$CHROMIUM" ]; then
  echo "run.sh: installing chromium" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
if [ ! -f "$here/node_modules/playwright-core/package.json" ]; then
  (cd "$here" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --silent)
fi
exec node "$here/check.mjs" "$@"
