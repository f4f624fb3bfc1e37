#!/bin/sh
# Summarises the FAULT lines of a fault-suite run (make soak): for each
# fault, the repetitions passed, and the median and maximum time to resume.
# Reads `go test -v` output on stdin.
awk '
/--- FAIL/ { fails++ }
/FAULT / {
	name = ""; ms = ""
	for (i = 1; i <= NF; i++) {
		if ($i == "FAULT") name = $(i + 1)
		if ($i ~ /^(resume_ms|run_ms)=/) { split($i, kv, "="); ms = kv[2] }
	}
	n[name]++; v[name, n[name]] = ms
}
END {
	printf "%-45s %5s %10s %10s\n", "fault", "reps", "median_ms", "max_ms"
	for (name in n) {
		k = n[name]
		for (i = 1; i <= k; i++) a[i] = v[name, i]
		for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
		printf "%-45s %5d %10d %10d\n", name, k, a[int((k + 1) / 2)], a[k]
	}
	printf "failed tests: %d\n", fails + 0
	exit fails > 0
}'
