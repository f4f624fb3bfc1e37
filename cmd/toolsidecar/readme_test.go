package main

import (
	"bytes"
	"errors"
	"go/format"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/testkit/syncbuf"
)

// readmeSection is the README's part whose blocks the tests run.
const readmeSection = "## Five minutes: point an application at it"

// block is a fenced block of the README: its language, its lines, and,
// for a shell block, what its comments say.
type block struct {
	lang  string
	lines []string
	line  int // where it begins in the README
}

// keepsRunning says whether the block starts a process that stays in the
// foreground: its first line says so.
func (b block) keepsRunning() bool {
	return len(b.lines) > 0 && strings.HasPrefix(b.lines[0], "# keeps running")
}

// prints is what the block says it prints: the comment lines after its
// first command.
func (b block) prints() []string {
	var out []string
	command := false
	for _, l := range b.lines {
		text, isComment := strings.CutPrefix(l, "# ")
		switch {
		case !isComment:
			command = true
		case command:
			out = append(out, text)
		}
	}
	return out
}

// role is what the block starts: its first command up to its flags. A
// block that starts what a running one started replaces it, as Ctrl-C and
// the new command in the same shell do.
func (b block) role() string {
	for _, l := range b.lines {
		if !strings.HasPrefix(l, "#") {
			head, _, _ := strings.Cut(l, " --")
			return head
		}
	}
	return ""
}

// readmeBlocks are the fenced blocks of the README's five-minute section,
// in order.
func readmeBlocks(t *testing.T) []block {
	t.Helper()
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []block
	var cur *block
	in := false
	for i, l := range strings.Split(string(data), "\n") {
		switch {
		case l == readmeSection:
			in = true
		case in && strings.HasPrefix(l, "## "):
			return blocks
		case !in:
		case cur == nil && strings.HasPrefix(l, "```"):
			cur = &block{lang: strings.TrimPrefix(l, "```"), line: i + 1}
		case cur != nil && l == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.lines = append(cur.lines, l)
		}
	}
	if !in {
		t.Fatalf("the README has no %q", readmeSection)
	}
	return blocks
}

// missing is the first part of want that out does not print, in order
// ("…" stands for what is left out), or "".
func missing(out string, want []string) string {
	pos := 0
	for _, w := range want {
		for part := range strings.SplitSeq(w, "…") {
			i := strings.Index(out[pos:], part)
			if i < 0 {
				return part
			}
			pos += i + len(part)
		}
	}
	return ""
}

// shell is a block running as a shell of its own: its process group,
// what it prints, and its end.
type shell struct {
	cmd  *exec.Cmd
	out  *syncbuf.Buffer
	done chan struct{} // closed when it has exited; err is then set
	err  error
}

func startShell(t *testing.T, dir string, env []string, b block) *shell {
	t.Helper()
	sh := &shell{cmd: exec.Command("bash", "-c", strings.Join(b.lines, "\n")), out: &syncbuf.Buffer{}, done: make(chan struct{})}
	sh.cmd.Dir, sh.cmd.Env, sh.cmd.Stdout, sh.cmd.Stderr = dir, env, sh.out, sh.out
	sh.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // Ctrl-C reaches the whole group
	if err := sh.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { sh.err = sh.cmd.Wait(); close(sh.done) }()
	return sh
}

// stop is Ctrl-C in the shell, then SIGKILL if it is still there after 20 s.
func (sh *shell) stop() {
	_ = syscall.Kill(-sh.cmd.Process.Pid, syscall.SIGINT)
	select {
	case <-sh.done:
	case <-time.After(20 * time.Second):
		_ = syscall.Kill(-sh.cmd.Process.Pid, syscall.SIGKILL)
		<-sh.done
	}
}

// readmePorts are the addresses the README's path serves on.
var readmePorts = []string{"127.0.0.1:8741", "127.0.0.1:4222", "127.0.0.1:9000", "127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003", "127.0.0.1:9004"}

// lockREADME keeps two runs of the README's path on one machine (two
// checkouts' tests) apart: they serve on the same ports.
func lockREADME(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "toolsidecar-readme-test.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() }) // closing releases the lock
	for _, addr := range readmePorts {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("the README's path serves on %s, which is taken: %v", addr, err)
		}
		ln.Close()
	}
}

// freshShellEnv is the environment of a new shell: nothing of the
// sidecar's or NATS's, and a temporary folder of the test's own, where the
// sidecar keeps its store and writes the worker credentials.
func freshShellEnv(t *testing.T) []string {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "NATS_") || strings.HasPrefix(kv, "TOOLSIDECAR_") || strings.HasPrefix(kv, "TSC_") || strings.HasPrefix(kv, "TMPDIR=")
	})
	return append(env, "TMPDIR="+t.TempDir())
}

// TestREADMEPath runs the shell blocks of the README's five-minute
// section as they are written, each in a shell of its own at the
// checkout's root, in order, on a fresh build: a block that keeps running
// must print what its comment says, and stays up for the blocks after it;
// any other block must exit 0 and print what its comments say (it is run
// again for a while until it does: a person reads between blocks, and the
// sidecar looks for workers' tools every two seconds). It fails when the
// README and the commands drift apart.
func TestREADMEPath(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs every way in")
	}
	lockREADME(t)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	env := freshShellEnv(t)
	running := map[string]*shell{}
	t.Cleanup(func() {
		for _, sh := range running {
			sh.stop()
		}
	})
	ran := 0
	for _, b := range readmeBlocks(t) {
		if b.lang != "sh" {
			continue
		}
		ran++
		want := b.prints()
		if b.keepsRunning() {
			if old := running[b.role()]; old != nil {
				old.stop()
			}
			sh := startShell(t, root, env, b)
			running[b.role()] = sh
			waitPrints(t, b, sh, want)
			continue
		}
		runUntilPrints(t, root, env, b, want)
	}
	if ran < 10 {
		t.Fatalf("%d shell blocks in the README's section: its marks changed", ran)
	}
}

// waitPrints waits until a running block prints what it says.
func waitPrints(t *testing.T, b block, sh *shell, want []string) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); missing(sh.out.String(), want) != ""; time.Sleep(50 * time.Millisecond) {
		select {
		case <-sh.done:
			t.Fatalf("README line %d: %s\nexited (%v) before it printed %q; it printed:\n%s", b.line, strings.Join(b.lines, "\n"), sh.err, missing(sh.out.String(), want), sh.out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("README line %d: %s\nafter 2 min it has not printed %q; it printed:\n%s", b.line, strings.Join(b.lines, "\n"), missing(sh.out.String(), want), sh.out.String())
		}
	}
}

// runUntilPrints runs a block until it exits 0 having printed what it
// says, for up to 30 s.
func runUntilPrints(t *testing.T, dir string, env []string, b block, want []string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		sh := startShell(t, dir, env, b)
		<-sh.done
		miss := missing(sh.out.String(), want)
		if sh.err == nil && miss == "" {
			return
		}
		var exit *exec.ExitError
		if time.Now().After(deadline) || (sh.err != nil && !errors.As(sh.err, &exit)) {
			t.Fatalf("README line %d: %s\nexit: %v; it has not printed %q; it printed:\n%s", b.line, strings.Join(b.lines, "\n"), sh.err, miss, sh.out.String())
		}
		time.Sleep(time.Second)
	}
}

// TestREADMEGoWorker builds the README's Go worker in a module of its own
// that starts from the checkout's go.mod and go.sum and reaches the project
// through a replace directive, offline, as the README says a worker outside
// the checkout does. So the build needs only what the checkout's build put
// in the module cache: on a machine whose cache was empty before make
// test, `go mod tidy` (and a Go workspace) would also want modules that
// only the tests of dependencies use, which nothing downloaded.
func TestREADMEGoWorker(t *testing.T) {
	var src []string
	for _, b := range readmeBlocks(t) {
		if b.lang == "go" {
			src = b.lines
		}
	}
	if src == nil {
		t.Fatal("no Go block in the README's section")
	}
	code := []byte(strings.Join(src, "\n") + "\n")
	if formatted, err := format.Source(code); err != nil || !bytes.Equal(formatted, code) {
		t.Errorf("the README's Go is not as gofmt writes it (%v):\n%s", err, formatted)
	}
	root, _ := filepath.Abs("../..")
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "main.go"), code, 0o600)
	// GOWORK and GOFLAGS of the caller's would change what the go command
	// reads.
	env := append(os.Environ(), "GOWORK=", "GOFLAGS=-modcacherw")
	if os.Getenv("TSC_TEST_FRESH_MODCACHE") == "1" {
		// As on a machine whose module cache was empty: a cache holding
		// only what the checkout's packages and their tests need, which is
		// what the checkout's own build and tests fetch there (make test
		// sets this).
		env = append(env, "GOMODCACHE="+t.TempDir())
		goCommand(t, root, env, "list", "-deps", "-test", "./...")
	}
	env = append(env, "GOPROXY=off") // offline, as the README says it works
	for _, f := range []string{"go.mod", "go.sum"} {
		data, _ := os.ReadFile(filepath.Join(root, f))
		os.WriteFile(filepath.Join(dir, f), data, 0o600)
	}
	for _, args := range [][]string{
		{"mod", "edit", "-module=example.com/weather", "-require=github.com/projectdavid/toolsidecar@v0.0.0", "-replace=github.com/projectdavid/toolsidecar=" + root},
		{"vet", "."},
		{"build", "-o", os.DevNull, "."},
	} {
		goCommand(t, dir, env, args...)
	}
}

// goCommand runs the go command in dir and fails the test with its output
// when it fails.
func goCommand(t *testing.T, dir string, env []string, args ...string) {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir, cmd.Env = dir, env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}
