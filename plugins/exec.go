package plugins

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/projectdavid/toolsidecar/bridge"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/registry"
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

func init() {
	Register("exec", Kind{Check: func(t config.Tool) error { _, err := execSettings(t); return err }, New: newExec})
}

func execSettings(t config.Tool) (ExecSettings, error) {
	var s ExecSettings
	if err := decodeSettings("exec", t.Exec, &s); err != nil {
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

func newExec(t *registry.Tool) (bridge.Handler, error) {
	s, err := execSettings(t.Config)
	if err != nil {
		return nil, err
	}
	env := []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range s.Env {
		env = append(env, k+"="+v)
	}
	return func(ctx context.Context, c *bridge.Call) ([]byte, error) {
		cmd := exec.CommandContext(ctx, s.Command[0], s.Command[1:]...)
		cmd.Dir, cmd.Env = s.Dir, env
		cmd.Stdin = bytes.NewReader(c.Manifest)
		stdout := &limitedBuffer{max: s.MaxOutputBytes}
		stderr := &limitedBuffer{max: stderrExcerpt}
		cmd.Stdout, cmd.Stderr = stdout, stderr
		// The process gets its own group so that a timeout kills the
		// children it started too.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		cmd.WaitDelay = time.Second
		err := cmd.Run()
		switch {
		case ctx.Err() != nil:
			if errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
				return nil, bridge.NewError(bridge.Timeout, "command %q killed at its deadline", s.Command[0])
			}
			return nil, bridge.NewError(bridge.Cancelled, "command %q killed: %v", s.Command[0], context.Cause(ctx))
		case stdout.over:
			return nil, bridge.NewError(bridge.ToolFailed, "command output exceeds %d bytes", s.MaxOutputBytes)
		case err != nil:
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return nil, bridge.NewError(bridge.ToolFailed, "command %q exited with status %d: %s", s.Command[0], ee.ExitCode(), strings.TrimSpace(stderr.String()))
			}
			return nil, bridge.NewError(bridge.ToolFailed, "command %q: %v", s.Command[0], err)
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
