package memlimit

import (
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	automemlimit "github.com/KimMachineGun/automemlimit/memlimit"
)

const mib = 1 << 20

// TestMain serves as the child of TestSetInACgroup: it sets the limit from
// the cgroup it was started in and prints what it set.
func TestMain(m *testing.M) {
	if os.Getenv("TSC_MEMLIMIT_CHILD") == "1" {
		limit, container, ok := Set()
		fmt.Printf("%d %d %v\n", limit, container, ok)
		os.Exit(0)
	}
	os.Exit(m.Run())
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

// TestSet: the runtime's limit is set by [For] from the container's, and
// left alone when GOMEMLIMIT sets it, AUTOMEMLIMIT is off, the container
// has no limit, or it cannot be read.
func TestSet(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	t.Setenv("GOMEMLIMIT", "") // empty: not set
	t.Setenv("AUTOMEMLIMIT", "")
	os.Unsetenv("AUTOMEMLIMIT")

	limit, container, ok := SetFrom(automemlimit.Limit(96 * mib))
	if !ok || container != 96*mib || limit != 72*mib || debug.SetMemoryLimit(-1) != 72*mib {
		t.Errorf("SetFrom = %d, %d, %v; runtime limit %d; want 72 MiB under 96 MiB", limit, container, ok, debug.SetMemoryLimit(-1))
	}
	for name, provider := range map[string]automemlimit.Provider{
		"no limit":   func() (uint64, error) { return 0, automemlimit.ErrNoLimit },
		"unreadable": func() (uint64, error) { return 0, errors.New("no cgroup here") },
	} {
		debug.SetMemoryLimit(math.MaxInt64)
		if _, _, ok := SetFrom(provider); ok || debug.SetMemoryLimit(-1) != math.MaxInt64 {
			t.Errorf("%s: a limit was set: %v, %d", name, ok, debug.SetMemoryLimit(-1))
		}
	}
	for env, val := range map[string]string{"GOMEMLIMIT": "200MiB", "AUTOMEMLIMIT": "off"} {
		t.Run(env, func(t *testing.T) {
			t.Setenv(env, val)
			debug.SetMemoryLimit(math.MaxInt64)
			if _, _, ok := SetFrom(automemlimit.Limit(96 * mib)); ok || debug.SetMemoryLimit(-1) != math.MaxInt64 {
				t.Errorf("%s=%s, yet the limit was changed: %v, %d", env, val, ok, debug.SetMemoryLimit(-1))
			}
		})
	}
}

// TestSetInACgroup starts this test binary in a memory cgroup of its own
// with a 256 MiB limit (cgroup v1 or v2, under the test's own cgroup), as
// a container runtime would: the limit it sets is For(256 MiB). It needs
// the right to create cgroups (root, as CI runs), and says so otherwise.
func TestSetInACgroup(t *testing.T) {
	dir, err := childCgroup(t)
	if err != nil {
		t.Skipf("no memory cgroup can be made here (%v): the cgroup itself is read by automemlimit, tested there", err)
	}
	limitFile, procs := filepath.Join(dir, "memory.max"), filepath.Join(dir, "cgroup.procs")
	if _, err := os.Stat(limitFile); err != nil {
		limitFile = filepath.Join(dir, "memory.limit_in_bytes")
	}
	if err := os.WriteFile(limitFile, []byte(fmt.Sprint(256*mib)), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", `echo $$ > "$1" && exec "$2"`, "sh", procs, os.Args[0])
	cmd.Env = []string{"TSC_MEMLIMIT_CHILD=1", "PATH=" + os.Getenv("PATH")} // no GOMEMLIMIT, no AUTOMEMLIMIT
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the child: %v", err)
	}
	want := fmt.Sprintf("%d %d true", For(256*mib), 256*mib)
	if got := strings.TrimSpace(string(out)); got != want {
		t.Errorf("in a 256 MiB cgroup the child set %q, want %q", got, want)
	}
}

// childCgroup makes a memory cgroup under this process's own, removed at
// the end of the test.
func childCgroup(t *testing.T) (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	var base string
	for line := range strings.Lines(string(b)) {
		f := strings.SplitN(strings.TrimSpace(line), ":", 3)
		switch {
		case len(f) != 3:
		case strings.Contains(","+f[1]+",", ",memory,"):
			base = filepath.Join("/sys/fs/cgroup/memory", f[2])
		case f[0] == "0" && f[1] == "" && base == "":
			if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
				base = filepath.Join("/sys/fs/cgroup", f[2])
			}
		}
	}
	if base == "" {
		return "", errors.New("no memory controller in /proc/self/cgroup")
	}
	dir := filepath.Join(base, fmt.Sprintf("tsc-memlimit-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", err
	}
	t.Cleanup(func() { _ = os.Remove(dir) }) // empty once the child has exited
	return dir, nil
}
