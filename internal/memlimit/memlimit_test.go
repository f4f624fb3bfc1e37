package memlimit

import (
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
)

// cgroupRoot writes files under a fresh root, path → content.
func cgroupRoot(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

const mib = 1 << 20

func TestContainer(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  int64 // 0: none
	}{
		{"v2 in its own namespace", map[string]string{"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "100663296\n"}, 96 * mib},
		{"v2 at the process's path", map[string]string{"proc/self/cgroup": "0::/kubepods/pod1/ctr\n",
			"sys/fs/cgroup/kubepods/pod1/ctr/memory.max": "268435456\n", "sys/fs/cgroup/memory.max": "max\n"}, 256 * mib},
		{"v2 without a limit", map[string]string{"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "max\n"}, 0},
		{"v1 with a limit", map[string]string{"proc/self/cgroup": "4:memory:/docker/abc\n", "sys/fs/cgroup/memory/memory.limit_in_bytes": "536870912\n"}, 512 * mib},
		{"v1 at the process's path", map[string]string{"proc/self/cgroup": "5:cpu,cpuacct:/a\n4:memory:/ts\n",
			"sys/fs/cgroup/memory/ts/memory.limit_in_bytes": "104857600\n", "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n"}, 100 * mib},
		{"v1 unlimited", map[string]string{"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n"}, 0},
		{"no cgroup files", map[string]string{}, 0},
		{"garbage", map[string]string{"sys/fs/cgroup/memory.max": "lots\n"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Container(cgroupRoot(t, tc.files))
			if ok != (tc.want != 0) || got != tc.want {
				t.Errorf("Container = %d, %v; want %d", got, ok, tc.want)
			}
		})
	}
}

// TestFor: the headroom below the container's limit is a tenth of it, at
// least 24 MiB (the measured RSS above the runtime's limit was 15–35
// MiB), and the limit never falls under half the container's.
func TestFor(t *testing.T) {
	for _, tc := range []struct{ container, want int64 }{
		{96 * mib, 72 * mib},
		{256 * mib, 256*mib - 256*mib/10},
		{512 * mib, 512*mib - 512*mib/10},
		{40 * mib, 20 * mib},
	} {
		if got := For(tc.container); got != tc.want {
			t.Errorf("For(%d MiB) = %.1f MiB, want %.1f MiB", tc.container/mib, float64(got)/mib, float64(tc.want)/mib)
		}
	}
}

// TestSet: the runtime's limit is set from the cgroup's, and left alone
// when GOMEMLIMIT sets it or the cgroup has none.
func TestSet(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	limited := cgroupRoot(t, map[string]string{"sys/fs/cgroup/memory.max": "100663296\n"})

	t.Setenv("GOMEMLIMIT", "") // empty: not set
	limit, container, ok := Set(limited)
	if !ok || container != 96*mib || limit != 72*mib || debug.SetMemoryLimit(-1) != 72*mib {
		t.Errorf("Set = %d, %d, %v; runtime limit %d; want 72 MiB under 96 MiB", limit, container, ok, debug.SetMemoryLimit(-1))
	}

	debug.SetMemoryLimit(math.MaxInt64)
	if _, _, ok := Set(cgroupRoot(t, map[string]string{"sys/fs/cgroup/memory.max": "max\n"})); ok || debug.SetMemoryLimit(-1) != math.MaxInt64 {
		t.Errorf("a cgroup without a limit set one: %v, %d", ok, debug.SetMemoryLimit(-1))
	}

	t.Setenv("GOMEMLIMIT", "200MiB")
	if _, _, ok := Set(limited); ok || debug.SetMemoryLimit(-1) != math.MaxInt64 {
		t.Errorf("GOMEMLIMIT set, yet the limit was changed: %v, %d", ok, debug.SetMemoryLimit(-1))
	}
}
