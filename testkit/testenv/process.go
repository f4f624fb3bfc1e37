package testenv

import (
	"bufio"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// StartProcess starts cmd (a worker, say), waits until a line of its
// output (stdout and stderr) contains ready, and stops it at the test's
// end: SIGINT, then SIGKILL after 5 s. A process that ends or stays
// silent for 30 s first fails the test with what it said.
func StartProcess(t testing.TB, cmd *exec.Cmd, ready string) {
	t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	lines := make(chan string)
	go func() {
		defer close(lines)
		for sc := bufio.NewScanner(out); sc.Scan(); {
			lines <- sc.Text()
		}
	}()
	deadline := time.After(30 * time.Second)
	var said []string
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("%s ended before it was ready: %s", cmd.Path, strings.Join(said, "\n"))
			}
			said = append(said, line)
			if strings.Contains(line, ready) {
				go func() { // the rest is read, so that the process never blocks on its output
					for range lines {
					}
				}()
				return
			}
		case <-deadline:
			t.Fatalf("%s not ready in 30s: %s", cmd.Path, strings.Join(said, "\n"))
		}
	}
}
