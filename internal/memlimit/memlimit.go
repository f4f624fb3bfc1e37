// Package memlimit sets the Go runtime's soft memory limit from the
// container's memory limit (its cgroup), unless GOMEMLIMIT sets one.
//
// The runtime's limit counts only the memory the runtime manages (heap,
// stacks, its own metadata). The container's limit counts the whole
// process: also the binary's pages and what the runtime has freed but
// not yet returned. A runtime limit equal to the container's lets the
// process reach the container's limit, and be killed there, exactly when
// the runtime limit should have kept it below. Measured on the sidecar
// (BENCHMARKS.md): the peak RSS was 15–17 MiB above GOMEMLIMIT at 1,000
// drives and 35 MiB above at 10,000. So the limit set here leaves a tenth
// of the container's, and at least 24 MiB, below it.
package memlimit

import (
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
)

// minHeadroom is the least the limit leaves for memory the runtime does
// not count.
const minHeadroom = 24 << 20

// For is the runtime's limit under a container limit of c bytes: c less a
// tenth of it, or less 24 MiB when that is more; never under half of c.
func For(c int64) int64 {
	return max(c-max(c/10, minHeadroom), c/2)
}

// Set applies [For] to the limit of the cgroup the process runs in, read
// under root ("/" but in tests), and reports both. It does nothing (ok is
// false) when GOMEMLIMIT is set or the cgroup has no limit.
func Set(root string) (limit, container int64, ok bool) {
	if os.Getenv("GOMEMLIMIT") != "" {
		return 0, 0, false
	}
	container, ok = Container(root)
	if !ok {
		return 0, 0, false
	}
	limit = For(container)
	debug.SetMemoryLimit(limit)
	return limit, container, true
}

// Container is the memory limit of the cgroup the process runs in: cgroup
// v2's memory.max, else cgroup v1's memory.limit_in_bytes, each looked up
// first at the process's own cgroup path (from /proc/self/cgroup), then
// at the root of the mount, which is the container's own cgroup when it
// has a cgroup namespace. ok is false when there is none ("max", or v1's
// near-MaxInt64 value).
func Container(root string) (int64, bool) {
	v2, v1 := ownPaths(root)
	var paths []string
	if v2 != "" {
		paths = append(paths, filepath.Join("sys/fs/cgroup", v2, "memory.max"))
	}
	paths = append(paths, "sys/fs/cgroup/memory.max")
	if v1 != "" {
		paths = append(paths, filepath.Join("sys/fs/cgroup/memory", v1, "memory.limit_in_bytes"))
	}
	paths = append(paths, "sys/fs/cgroup/memory/memory.limit_in_bytes")
	for _, p := range paths {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil || n <= 0 || n >= 1<<62 {
			return 0, false // "max", or v1's unlimited
		}
		return n, true
	}
	return 0, false
}

// ownPaths are the process's cgroup paths, from /proc/self/cgroup: v2's
// "0::/path" line and v1's memory controller line ("4:memory:/path").
func ownPaths(root string) (v2, v1 string) {
	b, err := os.ReadFile(filepath.Join(root, "proc/self/cgroup"))
	if err != nil {
		return "", ""
	}
	for line := range strings.Lines(string(b)) {
		fields := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(fields) != 3 || fields[2] == "/" {
			continue
		}
		switch {
		case fields[0] == "0" && fields[1] == "":
			v2 = fields[2]
		case slices.Contains(strings.Split(fields[1], ","), "memory"):
			v1 = fields[2]
		}
	}
	return v2, v1
}
