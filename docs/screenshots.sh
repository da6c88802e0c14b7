#!/usr/bin/env bash
# Regenerates the web console's screenshots in docs/ (PNG, one per page):
# starts an in-process keyline with sample traffic (devices, keyed workers,
# dead letters, a slow subscriber), lets it run so the charts have a history,
# and captures every page with headless Chromium (Debian's chromium package,
# or KEYLINE_CHROMIUM=/path/to/chrome). About three minutes.
#
#   docs/screenshots.sh              # into docs/
#   docs/screenshots.sh /tmp/shots   # elsewhere
#   WARMUP=5s docs/screenshots.sh    # quicker, with shorter chart histories
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-docs}")
command -v chromium >/dev/null 2>&1 || [ -n "${KEYLINE_CHROMIUM:-}" ] || {
  echo "screenshots.sh: needs chromium (apt-get install chromium) or KEYLINE_CHROMIUM" >&2
  exit 1
}
go test ./broker -run '^TestConsoleScreenshots$' -count=1 -v -timeout 10m \
  -args -console.screenshots="$out" -console.warmup="${WARMUP:-2m}" | grep -a -E '(\.png|^(--- |ok|FAIL))'
