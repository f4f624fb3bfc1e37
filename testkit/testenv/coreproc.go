package testenv

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/sim/agentssim"
	"github.com/projectdavid/toolsidecar/sim/anthropicsim"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/sim/managedsim"
	"github.com/projectdavid/toolsidecar/sim/openaisim"
	"github.com/projectdavid/toolsidecar/sim/responsesim"
)

// The environment variables that carry a simulator's configuration to the
// process that serves it.
const (
	envCoreProcess      = "TSC_TEST_CORESIM"
	envOpenAIProcess    = "TSC_TEST_OPENAISIM"
	envMessagesProcess  = "TSC_TEST_ANTHROPICSIM"
	envResponsesProcess = "TSC_TEST_RESPONSESIM"
	envAgentsProcess    = "TSC_TEST_AGENTSSIM"
	envManagedProcess   = "TSC_TEST_MANAGEDSIM"
)

// MaybeServe serves a simulator and exits when this process was started
// by [CoreProcess], [OpenAIProcess], [MessagesProcess] or
// [ResponsesProcess]; call it first in TestMain.
func MaybeServe() {
	var url string
	var stop func()
	switch {
	case os.Getenv(envCoreProcess) != "":
		var cfg coresim.Config
		exitOn(json.Unmarshal([]byte(os.Getenv(envCoreProcess)), &cfg))
		_, srv := coresim.NewServer(cfg)
		url, stop = srv.URL, srv.Close
	case os.Getenv(envOpenAIProcess) != "":
		url, stop = serveSim(envOpenAIProcess, openaisim.New)
	case os.Getenv(envMessagesProcess) != "":
		url, stop = serveSim(envMessagesProcess, anthropicsim.New)
	case os.Getenv(envResponsesProcess) != "":
		url, stop = serveSim(envResponsesProcess, responsesim.New)
	case os.Getenv(envAgentsProcess) != "":
		url, stop = serveSim(envAgentsProcess, agentssim.New)
	case os.Getenv(envManagedProcess) != "":
		url, stop = serveSim(envManagedProcess, managedsim.New)
	default:
		return
	}
	fmt.Println(url)
	_, _ = io.Copy(io.Discard, os.Stdin) // until the test closes it
	stop()
	os.Exit(0)
}

// serveSim serves the simulator that newSim makes of the configuration in
// the environment variable env.
func serveSim[C any, S http.Handler](env string, newSim func(C) S) (url string, stop func()) {
	var cfg C
	exitOn(json.Unmarshal([]byte(os.Getenv(env)), &cfg))
	srv := httptest.NewServer(newSim(cfg))
	return srv.URL, srv.Close
}

func exitOn(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "simulator process:", err)
		os.Exit(2)
	}
}

// serveApart starts the test binary again with env set to spec; its
// TestMain calls [MaybeServe], which prints the simulator's URL and serves
// until stop closes its stdin.
func serveApart(t testing.TB, env string, spec any) (url string, stop func()) {
	cmd, stdin, stdout := Again(t, env, spec)
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("the simulator's process did not start: %v", err)
	}
	return strings.TrimSpace(line), func() {
		stdin.Close()
		_ = cmd.Wait()
	}
}

// Again starts the test binary again, running no test, with the
// environment variable env set to spec in JSON: its TestMain sees it and
// plays the part spec describes, talking over stdin and stdout.
func Again(t testing.TB, env string, spec any) (cmd *exec.Cmd, stdin io.WriteCloser, stdout io.ReadCloser) {
	t.Helper()
	data, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env+"="+string(data))
	cmd.Stderr = os.Stderr
	stdin, _ = cmd.StdinPipe()
	stdout, _ = cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, stdin, stdout
}

// violationsAt reads a simulator's contract log over HTTP.
func violationsAt[V any](t testing.TB, url string) []V {
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, url+"/_sim/violations", nil)
	req.Header.Set("X-API-Key", APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("reading the simulator's contract log: %v", err)
	}
	defer resp.Body.Close()
	var v []V
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatalf("reading the simulator's contract log: %v", err)
	}
	return v
}

// CoreProcess serves a simulator of cfg (APIKey is set to [APIKey]) in a
// process of its own, the test binary started again, whose TestMain calls
// [MaybeServe] first: the sidecar then meets Core over a real loopback
// connection to another process, as in production. serve is an
// [Options.ServeCore] (the in-process simulator it is given is not used);
// violations reads the process's contract log.
func CoreProcess(t testing.TB, cfg coresim.Config) (serve func(*coresim.Sim) (string, *core.Client, func()), violations func() []coresim.Violation) {
	cfg.APIKey = APIKey
	var url string
	serve = func(*coresim.Sim) (string, *core.Client, func()) {
		var stop func()
		url, stop = serveApart(t, envCoreProcess, cfg)
		app, err := core.New(core.Config{URL: url, APIKey: APIKey, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return url, app, stop
	}
	return serve, func() []coresim.Violation { return violationsAt[coresim.Violation](t, url) }
}

// OpenAIProcess serves an OpenAI-compatible simulator of cfg (its scripted
// model: cfg.Model is not carried) in a process of its own, as
// [CoreProcess] does Core's, until the test ends. It returns the API's
// base URL (with /v1) and what reads the contract log.
func OpenAIProcess(t testing.TB, cfg openaisim.Config) (baseURL string, violations func() []openaisim.Violation) {
	url, stop := serveApart(t, envOpenAIProcess, cfg)
	t.Cleanup(stop)
	return url + "/v1", func() []openaisim.Violation { return violationsAt[openaisim.Violation](t, url) }
}

// MessagesProcess serves an Anthropic Messages simulator of cfg (its
// scripted model) in a process of its own, as [OpenAIProcess] does. It
// returns the API's base URL (without /v1, as the official clients take
// it) and what reads the contract log.
func MessagesProcess(t testing.TB, cfg anthropicsim.Config) (baseURL string, violations func() []anthropicsim.Violation) {
	url, stop := serveApart(t, envMessagesProcess, cfg)
	t.Cleanup(stop)
	return url, func() []anthropicsim.Violation { return violationsAt[anthropicsim.Violation](t, url) }
}

// ResponsesProcess serves an OpenAI Responses simulator of cfg (its
// scripted model) in a process of its own, as [OpenAIProcess] does. It
// returns the API's base URL (with /v1) and what reads the contract log.
func ResponsesProcess(t testing.TB, cfg responsesim.Config) (baseURL string, violations func() []responsesim.Violation) {
	url, stop := serveApart(t, envResponsesProcess, cfg)
	t.Cleanup(stop)
	return url + "/v1", func() []responsesim.Violation { return violationsAt[responsesim.Violation](t, url) }
}

// AgentsProcess serves an OpenAI Agents API simulator of cfg in a process
// of its own, as [OpenAIProcess] does, until the test ends. It returns
// the simulator's URL (the API's base is it with /v1), what reads the
// contract log, and what reads a session.
func AgentsProcess(t testing.TB, cfg agentssim.Config) (url string, violations func() []agentssim.Violation, session func(id string) agentssim.Session) {
	url, stop := serveApart(t, envAgentsProcess, cfg)
	t.Cleanup(stop)
	return url, func() []agentssim.Violation { return violationsAt[agentssim.Violation](t, url) },
		func(id string) agentssim.Session { return sessionAt[agentssim.Session](t, url, id) }
}

// ManagedProcess serves an Anthropic Managed Agents simulator of cfg in a
// process of its own, as [AgentsProcess] does (the API's base is the URL).
func ManagedProcess(t testing.TB, cfg managedsim.Config) (url string, violations func() []managedsim.Violation, session func(id string) managedsim.Session) {
	url, stop := serveApart(t, envManagedProcess, cfg)
	t.Cleanup(stop)
	return url, func() []managedsim.Violation { return violationsAt[managedsim.Violation](t, url) },
		func(id string) managedsim.Session { return sessionAt[managedsim.Session](t, url, id) }
}

// sessionAt reads a hosted simulator's session over HTTP; the zero
// session when it has none.
func sessionAt[S any](t testing.TB, url, id string) S {
	var s S
	resp, err := http.Get(url + "/_sim/sessions/" + id)
	if err != nil {
		t.Fatalf("reading the simulator's session: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
			t.Fatalf("reading the simulator's session: %v", err)
		}
	}
	return s
}
