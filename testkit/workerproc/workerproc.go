// Package workerproc runs a Go tool worker as a real process for fault
// tests: the test binary itself, started again with an environment that
// makes its TestMain call Main instead of the tests. Each execution is
// appended to a log file, so that a test counts executions across
// processes, including processes it killed. It is for tests only.
package workerproc

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/worker"
)

const (
	envURLs   = "TSC_TEST_WORKER"
	envLog    = "TSC_TEST_EXEC_LOG"
	envPrefix = "TSC_TEST_PREFIX"
	envUser   = "TSC_TEST_USER"
	envPass   = "TSC_TEST_PASSWORD"
	envDelay  = "TSC_TEST_DELAY"
	envDecl   = "TSC_TEST_DECLARE"
)

// Tools are the tools a worker process serves: each logs its execution,
// waits the configured delay (or until cancelled) and answers
// "<tool> done".
var Tools = []string{"look", "pay"}

// Echo is a tool every worker process also serves: it answers the manifest
// at once and logs nothing, so that a benchmark sees only the dispatching
// side's cost in its own process.
const Echo = "echo"

// MaybeRun runs the worker and exits when this process was started as one;
// call it first in TestMain.
func MaybeRun() {
	if os.Getenv(envURLs) != "" {
		os.Exit(run())
	}
}

func run() int {
	opts := []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}
	if u := os.Getenv(envUser); u != "" {
		opts = append(opts, nats.UserInfo(u, os.Getenv(envPass)))
	}
	nc, err := nats.Connect(os.Getenv(envURLs), opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	defer nc.Close()
	log, err := os.OpenFile(os.Getenv(envLog), os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	defer log.Close()
	delay, _ := time.ParseDuration(os.Getenv(envDelay))
	var declare map[string]tool.Declaration
	if d := os.Getenv(envDecl); d != "" {
		if err := json.Unmarshal([]byte(d), &declare); err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			return 1
		}
	}
	w := worker.New(nc, os.Getenv(envPrefix))
	for _, name := range Tools {
		h := func(ctx context.Context, c *tool.Call) ([]byte, error) {
			fmt.Fprintf(log, "%s %s %d\n", c.Tool, c.ActionID, os.Getpid()) // one write: atomic with O_APPEND
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return []byte(`"` + c.Tool + ` done"`), nil
		}
		d, declared := declare[name]
		if !declared {
			w.Handle(name, h)
		} else if err := w.HandleDeclared(name, d, h); err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			return 1
		}
	}
	w.Handle(Echo, func(ctx context.Context, c *tool.Call) ([]byte, error) { return c.Manifest, nil })
	if err := w.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	<-sigs
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = w.Stop(ctx)
	return 0
}

// Config says where a worker process connects and how it behaves.
type Config struct {
	URLs           string // the NATS server list
	Prefix         string // the tools' subject prefix
	User, Password string // credentials, when the server wants them
	Delay          time.Duration
	ExecLog        string // the execution log, shared by every worker of a test
	// Declare declares tools of Tools in the worker's code, by name; the
	// others are served without a declaration.
	Declare map[string]tool.Declaration
}

// Process is a running worker process.
type Process struct{ cmd *exec.Cmd }

// Start starts a worker process; t.Cleanup stops it (SIGTERM) if it
// still runs.
func Start(t testing.TB, cfg Config) *Process {
	t.Helper()
	decl, err := json.Marshal(cfg.Declare)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envURLs+"="+cfg.URLs, envLog+"="+cfg.ExecLog, envPrefix+"="+cfg.Prefix,
		envUser+"="+cfg.User, envPass+"="+cfg.Password, envDelay+"="+cfg.Delay.String(), envDecl+"="+string(decl))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &Process{cmd: cmd}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT) // a paused process takes SIGTERM only once resumed
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	return p
}

// Signal sends the process sig (SIGSTOP pauses it, SIGCONT resumes it).
func (p *Process) Signal(t testing.TB, sig os.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// Kill kills the process with SIGKILL and reaps it.
func (p *Process) Kill(t testing.TB) {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Wait()
}

// Executions reads an execution log: how often each call ran, keyed
// "tool action_id", and the total.
func Executions(t testing.TB, path string) (byCall map[string]int, total int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	byCall = map[string]int{}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) == 3 {
			byCall[f[0]+" "+f[1]]++
			total++
		}
	}
	return byCall, total
}
