#!/usr/bin/env python3
"""A toolsidecar tool in Python's standard library alone, for route exec.

The sidecar (or `toolsidecar worker`) runs this program once per call. The
manifest arrives on stdin exactly as Core sent it:

    {"type": "tool_call_manifest", "run_id": "...", "action_id": "...",
     "tool_call_id": "...", "tool": "get_flight_times", "args": {...}}

Whatever is printed on stdout is the result the model sees. A non-zero exit
status is an error outcome (tool_error) carrying what was printed on stderr.
"""
import json
import sys

DURATIONS = {("LAX", "JFK"): "5h 35m", ("SFO", "ORD"): "4h 10m", ("SEA", "BOS"): "5h 20m"}


def main() -> int:
    manifest = json.load(sys.stdin)
    args = manifest.get("args") or {}
    route = (args.get("departure"), args.get("arrival"))
    if route not in DURATIONS:
        print(f"no flights from {route[0]} to {route[1]}", file=sys.stderr)
        return 3
    json.dump({"route": "-".join(route), "duration": DURATIONS[route], "tool_call_id": manifest["tool_call_id"]}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
