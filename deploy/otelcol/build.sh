#!/usr/bin/env bash
# Build the Collector of deploy/otelcol/builder.yaml with the Collector's own builder (ocb) into
# a cache folder keyed by the manifest's and this script's hash, so a second run reuses the binary.
# Prints the binary's path on stdout (progress goes to stderr).
#   deploy/otelcol/build.sh            # builds if needed, prints .cache/otelcol/<hash>/otelcol-stepwatch
# Env: STEPWATCH_OTELCOL_CACHE (default <repo>/.cache/otelcol), GOFLAGS/GOMODCACHE as usual.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
manifest="$here/builder.yaml"
cache="${STEPWATCH_OTELCOL_CACHE:-$repo/.cache/otelcol}"
ocb_version="$(sed -n 's/^  version: *//p' "$manifest" | head -1)"
key="$(cat "$manifest" "$0" | sha256sum | cut -c1-16)"
out="$cache/$key"
binary="$out/otelcol-stepwatch/otelcol-stepwatch"

if [[ -x "$binary" ]]; then
  echo "$binary"
  exit 0
fi
command -v go >/dev/null || { echo "build.sh: go is not installed (needs Go >= 1.25)" >&2; exit 2; }

mkdir -p "$out"
export GOBIN="$cache/bin-$ocb_version"
if [[ ! -x "$GOBIN/builder" ]]; then
  echo "build.sh: installing ocb (go.opentelemetry.io/collector/cmd/builder@v$ocb_version)" >&2
  go install "go.opentelemetry.io/collector/cmd/builder@v$ocb_version"
fi

start=$(date +%s)
echo "build.sh: building the Collector into $out (first build takes minutes)" >&2
# ocb resolves output_path against its working directory; build into a temporary folder and move
# the finished tree into place, so an interrupted build never leaves a binary that looks complete.
tmp="$(mktemp -d "$out/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
cp "$manifest" "$tmp/builder.yaml"
(cd "$tmp" && "$GOBIN/builder" --config builder.yaml >&2)
rm -rf "$out/otelcol-stepwatch"
mv "$tmp/otelcol-stepwatch" "$out/otelcol-stepwatch"
end=$(date +%s)
echo "build.sh: built in $((end - start)) s, $(du -h "$binary" | cut -f1)" >&2
echo "$binary"
