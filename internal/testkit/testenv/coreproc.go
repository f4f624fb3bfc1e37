package testenv

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/coresim"
)

// envCoreProcess carries a simulator's configuration to the process that
// serves it.
const envCoreProcess = "TSC_TEST_CORESIM"

// MaybeServeCore serves the simulator and exits when this process was
// started by [CoreProcess]; call it first in TestMain.
func MaybeServeCore() {
	spec := os.Getenv(envCoreProcess)
	if spec == "" {
		return
	}
	var cfg coresim.Config
	if err := json.Unmarshal([]byte(spec), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "coresim process:", err)
		os.Exit(2)
	}
	_, srv := coresim.NewServer(cfg)
	fmt.Println(srv.URL)
	_, _ = io.Copy(io.Discard, os.Stdin) // until the test closes it
	srv.Close()
	os.Exit(0)
}

// CoreProcess serves a simulator of cfg (APIKey is set to [APIKey]) in a
// process of its own, the test binary started again, whose TestMain calls
// [MaybeServeCore] first: the sidecar then meets Core over a real
// loopback connection to another process, as in production. serve is an
// [Options.ServeCore] (the in-process simulator it is given is not used);
// violations reads the process's contract log.
func CoreProcess(t testing.TB, cfg coresim.Config) (serve func(*coresim.Sim) (string, *core.Client, func()), violations func() []coresim.Violation) {
	cfg.APIKey = APIKey
	var url string
	serve = func(*coresim.Sim) (string, *core.Client, func()) {
		spec, err := json.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envCoreProcess+"="+string(spec))
		cmd.Stderr = os.Stderr
		stdin, _ := cmd.StdinPipe()
		stdout, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err != nil {
			t.Fatalf("the simulator's process did not start: %v", err)
		}
		url = strings.TrimSpace(line)
		app, err := core.New(core.Config{URL: url, APIKey: APIKey, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return url, app, func() {
			stdin.Close()
			_ = cmd.Wait()
		}
	}
	violations = func() []coresim.Violation {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, url+"/_sim/violations", nil)
		req.Header.Set("X-API-Key", APIKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("reading the simulator's contract log: %v", err)
		}
		defer resp.Body.Close()
		var v []coresim.Violation
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
			t.Fatalf("reading the simulator's contract log: %v", err)
		}
		return v
	}
	return serve, violations
}
