// Package memlimit sets the Go runtime's soft memory limit from the
// container's memory limit, unless GOMEMLIMIT sets one (or AUTOMEMLIMIT is
// off). The container's limit is read by automemlimit, which finds the
// process's own cgroup (v1, v2 or both) through /proc/self/mountinfo.
//
// The runtime's limit counts only the memory the runtime manages (heap,
// stacks, its own metadata). The container's limit counts the whole
// process: also the binary's pages and what the runtime has freed but
// not yet returned. A runtime limit equal to the container's lets the
// process reach the container's limit, and be killed there, exactly when
// the runtime limit should have kept it below. Measured on the sidecar
// (BENCHMARKS.md): the peak RSS was 15–17 MiB above GOMEMLIMIT at 1,000
// drives and 35 MiB above at 10,000. So the limit set here leaves a tenth
// of the container's, and at least 24 MiB, below it: automemlimit's ratio
// alone (0.9) would leave 13 MiB under a 128 MiB container.
package memlimit

import (
	"math"

	automemlimit "github.com/KimMachineGun/automemlimit/memlimit"
)

// minHeadroom is the least the limit leaves for memory the runtime does
// not count.
const minHeadroom = 24 << 20

// For is the runtime's limit under a container limit of c bytes: c less a
// tenth of it, or less 24 MiB when that is more; never under half of c.
func For(c int64) int64 {
	return max(c-max(c/10, minHeadroom), c/2)
}

// Set applies [For] to the limit of the container the process runs in
// (its cgroup), and reports both. It does nothing (ok is false) when
// GOMEMLIMIT is set, AUTOMEMLIMIT is off, or the cgroup has no limit.
func Set() (limit, container int64, ok bool) {
	return SetFrom(automemlimit.FromCgroup)
}

// SetFrom is [Set] with the container's limit read from provider.
func SetFrom(provider automemlimit.Provider) (limit, container int64, ok bool) {
	var c uint64
	limit, err := automemlimit.Set(automemlimit.WithRatio(1), automemlimit.WithProvider(func() (uint64, error) {
		n, err := provider()
		if err != nil {
			return 0, err
		}
		c = min(n, math.MaxInt64)
		return uint64(For(int64(c))), nil
	}))
	if err != nil || c == 0 {
		return 0, 0, false
	}
	return limit, int64(c), true
}
