#!/usr/bin/env bash
# Runs a command with NATS_URL pointing at a fresh embedded NATS server
# (cmd/natsd on a free loopback port), and stops the server afterwards;
# NATSD names the natsd binary, for a test that starts a server of its own.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$tmp"' EXIT
(cd "$root" && go build -o "$tmp/natsd" ./cmd/natsd)
"$tmp/natsd" --listen 127.0.0.1:-1 --url-file "$tmp/url" >/dev/null &
pid=$!
for _ in $(seq 1 100); do [ -s "$tmp/url" ] && break; sleep 0.05; done
[ -s "$tmp/url" ] || { echo "with-nats: natsd did not start" >&2; exit 1; }
NATS_URL="$(cat "$tmp/url")" NATSD="$tmp/natsd" "$@"
