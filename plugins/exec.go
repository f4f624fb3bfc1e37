package plugins

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/tool"
)

// ExecSettings configure route exec: one process per call. The manifest
// JSON goes to stdin; stdout is the result; a non-zero exit is a
// tool_error carrying an excerpt of stderr.
type ExecSettings struct {
	// Command is the argv; required.
	Command []string `json:"command"`
	// Env is added to the process environment, which otherwise holds only
	// PATH: the sidecar's secrets are not inherited.
	Env map[string]string `json:"env"`
	// Dir is the working directory. default: the sidecar's
	Dir string `json:"dir"`
	// MaxOutputBytes bounds stdout. default: 1 MiB
	MaxOutputBytes int `json:"max_output_bytes"`
}

const stderrExcerpt = 2048

// execKind is route exec. processes bounds its processes running at once
// across all tools and runs (executor.max_exec_processes).
type execKind struct {
	inProcess
	processes semaphore
}

type semaphore chan struct{}

func newSemaphore(n int) semaphore { return make(semaphore, n) }

func (s semaphore) size() int { return cap(s) }

// acquire takes a slot, waiting while all are taken, until ctx ends.
func (s semaphore) acquire(ctx context.Context) (release func(), err error) {
	select {
	case s <- struct{}{}:
		return func() { <-s }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func execSettings(settings map[string]any) (ExecSettings, error) {
	var s ExecSettings
	if err := registry.DecodeSettings("exec", settings, &s); err != nil {
		return s, err
	}
	if len(s.Command) == 0 || s.Command[0] == "" {
		return s, errors.New("exec.command: must be a non-empty list (argv)")
	}
	if s.MaxOutputBytes <= 0 {
		s.MaxOutputBytes = 1 << 20
	}
	return s, nil
}

// Check finds the program the tool runs, as a call will.
func (*execKind) Check(_ context.Context, def *registry.Tool) error {
	s, err := execSettings(def.Settings())
	if err != nil {
		return err
	}
	if _, err := exec.LookPath(s.Command[0]); err != nil {
		return fmt.Errorf("command: %w", err)
	}
	return nil
}

func (k *execKind) Build(_ *registry.Tool, settings map[string]any) (tool.Handler, error) {
	processes := k.processes
	s, err := execSettings(settings)
	if err != nil {
		return nil, err
	}
	env := []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range s.Env {
		env = append(env, k+"="+v)
	}
	return func(ctx context.Context, c *tool.Call) ([]byte, error) {
		cmd := exec.CommandContext(ctx, s.Command[0], s.Command[1:]...)
		cmd.Dir, cmd.Env = s.Dir, env
		cmd.Stdin = bytes.NewReader(c.Manifest)
		stdout := &limitedBuffer{max: s.MaxOutputBytes}
		stderr := &limitedBuffer{max: stderrExcerpt}
		cmd.Stdout, cmd.Stderr = stdout, stderr
		// The process gets its own group, and a timeout kills the whole
		// tree it started, including children that left the group.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return killTree(cmd.Process.Pid) }
		cmd.WaitDelay = time.Second
		release, err := processes.acquire(ctx)
		if err != nil {
			return nil, tool.NewError(tool.RateLimited, "waited for one of the %d exec processes allowed at once: %v", processes.size(), context.Cause(ctx))
		}
		defer release()
		err = cmd.Run()
		switch {
		case ctx.Err() != nil:
			if errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
				return nil, tool.NewError(tool.Timeout, "command %q killed at its deadline", s.Command[0])
			}
			return nil, tool.NewError(tool.Cancelled, "command %q killed: %v", s.Command[0], context.Cause(ctx))
		case stdout.over:
			return nil, tool.NewError(tool.ToolFailed, "command output exceeds %d bytes", s.MaxOutputBytes)
		case err != nil:
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return nil, tool.NewError(tool.ToolFailed, "command %q exited with status %d: %s", s.Command[0], ee.ExitCode(), strings.TrimSpace(stderr.String()))
			}
			return nil, tool.NewError(tool.ToolFailed, "command %q: %v", s.Command[0], err)
		}
		return stdout.Bytes(), nil
	}, nil
}

// limitedBuffer keeps the first max bytes and notes whether more came. It
// does not embed bytes.Buffer: io.Copy would find its ReadFrom and bypass
// the limit.
type limitedBuffer struct {
	buf  bytes.Buffer
	max  int
	over bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.buf.Len(); len(p) > room {
		b.over = true
		if room > 0 {
			b.buf.Write(p[:room])
		}
		return len(p), nil
	}
	return b.buf.Write(p)
}

func (b *limitedBuffer) Bytes() []byte  { return b.buf.Bytes() }
func (b *limitedBuffer) String() string { return b.buf.String() }
