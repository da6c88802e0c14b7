#!/usr/bin/env bash
# Builds versioned, static keyline binaries for the platforms Keyline is released for:
# linux/amd64 (servers), linux/arm64 and linux/armv7 (edge gateways, Raspberry Pi class),
# with SHA256SUMS beside them.
#
#   dist/release.sh                  # version from `git describe`, output in dist/out/
#   VERSION=v1.4.0 OUT=/tmp/rel dist/release.sh
#   PLATFORMS="linux/arm64" dist/release.sh
#
# The binaries are pure Go (CGO_ENABLED=0): no libc, they run on any Linux of their
# architecture. `keyline --version` prints the version, commit and build date set here.
set -euo pipefail
cd "$(dirname "$0")/.."

version=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
# The commit's own time, not the wall clock: building one commit twice gives the same binary.
date=$(git show -s --format=%cI HEAD 2>/dev/null || date -u +%Y-%m-%dT%H:%M:%SZ)
out=${OUT:-dist/out}
platforms=${PLATFORMS:-"linux/amd64 linux/arm64 linux/armv7"}

mkdir -p "$out"
rm -f "$out"/keyline-"$version"-* "$out/SHA256SUMS"
ldflags="-s -w -X main.version=$version -X main.commit=$commit -X main.buildDate=$date"
for p in $platforms; do
  os=${p%/*} arch=${p#*/} arm=
  if [ "$arch" = armv7 ]; then arch=arm arm=7; fi
  name="keyline-$version-$os-${p#*/}"
  echo "building $name"
  CGO_ENABLED=0 GOOS=$os GOARCH=$arch GOARM=$arm \
    go build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$out/$name" .
done
(cd "$out" && sha256sum keyline-"$version"-* > SHA256SUMS && cat SHA256SUMS)
