package plugins

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// killTree kills a process, its process group, and every descendant found
// in /proc, even those that left the group with setsid. The walk is taken
// while the process still runs, so that the parent links are intact. Where
// /proc is absent only the group is killed.
func killTree(pid int) error {
	victims := descendants(pid)
	err := syscall.Kill(-pid, syscall.SIGKILL)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for _, p := range victims {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	return err
}

// descendants lists the processes below root, from /proc/*/stat.
func descendants(root int) []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	children := map[int][]int{}
	for _, f := range stats {
		data, err := os.ReadFile(f)
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...; comm may hold spaces and parens.
		s := string(data)
		end := strings.LastIndexByte(s, ')')
		if end < 0 {
			continue
		}
		fields := strings.Fields(s[end+1:])
		if len(fields) < 2 {
			continue
		}
		pid, err1 := strconv.Atoi(strings.Fields(s)[0])
		ppid, err2 := strconv.Atoi(fields[1])
		if err1 == nil && err2 == nil {
			children[ppid] = append(children[ppid], pid)
		}
	}
	var out []int
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}
