// Package demo runs toolsidecar end to end on one machine: the embedded
// NATS server, the Core simulator, Go demo workers, and one scripted run
// whose first turn is a parallel batch with an invalid-arguments call, an
// unknown tool, a failing tool, a slow tool that sends progress and a call
// that waits for a person's approval (the demo approves it). It
// prints a transcript with per-call and per-batch timings. A second part
// runs the same batch through an OpenAI-compatible upstream (the
// simulator of package openaisim), for an application that speaks Chat
// Completions, a third through an Anthropic Messages upstream (package
// anthropicsim) and a fourth through an OpenAI Responses upstream
// (package responsesim).
package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/projectdavid/toolsidecar"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/internal/clock"
	"github.com/projectdavid/toolsidecar/sidecar"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/worker"
)

// Scenario is the demo conversation.
func Scenario() coresim.Scenario {
	return coresim.Scenario{Name: "trip", Turns: []coresim.Turn{
		{
			Reasoning: "The user wants a New York trip: flights, a booking and a hotel.",
			Content:   "Let me look that up.",
			Calls: []coresim.Call{
				{Tool: "get_flight_times", ArgsJSON: `{"departure": "LAX", "arrival": "JFK"}`},
				{Tool: "get_flight_times", ArgsJSON: `{"departure": "SFO", "arrival": "JFK"}`},
				{Tool: "book_flight", ArgsJSON: `{"flight": "UA 512", "passenger": "A. Lovelace"}`},
				{Tool: "search_hotels", ArgsJSON: `{"city": "New York", "nights": 3}`},
				{Tool: "get_flight_times", ArgsJSON: `{"departure": "LAX"}`},
				{Tool: "get_weather", ArgsJSON: `{"city": "New York"}`},
				{Tool: "convert_currency", ArgsJSON: `{"amount": 420, "from": "USD", "to": "EUR"}`},
				{Tool: "hold_room", ArgsJSON: `{"hotel": "The Plaza", "nights": 3, "deposit_usd": 150}`},
			},
		},
		{Content: "Here is what I found:\n{{results}}"},
	}}
}

// flightArgs are get_flight_times's arguments. The demo worker declares
// the tool in its code, the schema derived from them; config.yaml's entry
// of the tool only sets its policies.
type flightArgs struct {
	Departure string `json:"departure" jsonschema:"IATA code of the departure airport"`
	Arrival   string `json:"arrival" jsonschema:"IATA code of the arrival airport"`
}

// Declared are the tools the demo worker declares in its code.
var Declared = []string{"get_flight_times"}

// Workers registers the demo tools on w: get_flight_times, declared in
// code, with a realistic delay, book_flight that always fails,
// search_hotels that is slower than its timeout but stays alive by sending
// progress, and hold_room, which a person approves first.
func Workers(w *worker.Worker) error {
	w.Handle("hold_room", func(ctx context.Context, c *tool.Call) ([]byte, error) {
		return []byte(`{"held": "The Plaza", "nights": 3, "deposit_usd": 150, "confirmation": "PLZ-7731"}`), nil
	})
	err := worker.Declare(w, "get_flight_times", worker.Spec{Description: "Flight times between two airports", SideEffects: tool.ReadOnly},
		func(ctx context.Context, c *tool.Call, a flightArgs) (json.RawMessage, error) {
			if err := clock.Sleep(ctx, 300*time.Millisecond); err != nil {
				return nil, err
			}
			return json.RawMessage(fmt.Sprintf(`{"route": "%s-%s", "duration": "5h 35m", "departures": ["07:00", "12:30", "18:45"]}`, a.Departure, a.Arrival)), nil
		})
	w.Handle("book_flight", func(ctx context.Context, c *tool.Call) ([]byte, error) {
		if err := clock.Sleep(ctx, 100*time.Millisecond); err != nil {
			return nil, err
		}
		return nil, tool.NewError(tool.ToolFailed, "no seats left on UA 512")
	})
	w.Handle("search_hotels", func(ctx context.Context, c *tool.Call) ([]byte, error) {
		for range 5 { // 1.5s in all, longer than its timeout: progress keeps it alive
			if err := clock.Sleep(ctx, 300*time.Millisecond); err != nil {
				return nil, err
			}
			if err := c.Progress(); err != nil {
				return nil, err
			}
		}
		return []byte(`{"hotels": ["The Plaza", "Pod 51"], "nights": 3}`), nil
	})
	return err
}

// ErrContract is returned when the simulator recorded a violation.
var ErrContract = errors.New("demo: contract violations recorded")

// Run performs the demo and writes the transcript to out.
func Run(ctx context.Context, out io.Writer) error {
	_, err := run(ctx, out)
	return err
}

// run is Run; it also returns the sidecar's metrics as they were at the
// end of the run.
func run(ctx context.Context, out io.Writer) (_ prometheus.Gatherer, err error) {
	start := time.Now()
	sim, srv := coresim.NewServer(coresim.Config{APIKey: apiKey, Scenario: Scenario()})
	defer srv.Close()
	dir, err := os.MkdirTemp("", "toolsidecar-demo-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	password, err := workerPassword(dir)
	if err != nil {
		return nil, err
	}
	s, err := startSidecar(srv.URL, filepath.Join(dir, "worker-password"), nil)
	if err != nil {
		return nil, err
	}
	defer s.Shutdown(context.Background())
	// The demo's operator approves hold_room over the HTTP API.
	defer serve(ctx, s)()
	stopWorkers, err := startWorkers(s, password)
	if err != nil {
		return nil, err
	}
	defer stopWorkers()
	req, err := setUp(ctx, srv.URL, s.Tools().FunctionTools())
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "toolsidecar demo: embedded NATS at %s, Core simulator at %s, %d tools, set up in %s\n",
		s.NATSURL(), srv.URL, len(s.Tools().Names()), ms(time.Since(start)))
	for _, name := range Declared {
		t, _ := s.Tools().Lookup(name)
		fmt.Fprintf(out, "%s: declared in the code of %s, policies from config.yaml\n", name, strings.Join(t.DeclaredBy, ", "))
	}
	fmt.Fprintf(out, "run %s\n\n", req.RunID)

	t := &transcript{out: out, t0: time.Now(), first: map[int]time.Time{}, last: map[int]time.Time{}}
	stopApprover := approve(ctx, "http://"+s.Addr(), t.say)
	sum, derr := s.Drive(ctx, req, t.event)
	stopApprover()
	t.summary(sum)
	v := sim.Violations()
	fmt.Fprintf(out, "contract log: %d violations\n", len(v))
	for _, x := range v {
		fmt.Fprintf(out, "  %s\n", x)
	}
	switch {
	case derr != nil:
		return s.Metrics(), derr
	case sum.Status != executor.StatusCompleted:
		return s.Metrics(), fmt.Errorf("demo: run ended %s: %s", sum.Status, sum.Error)
	case len(v) > 0:
		return s.Metrics(), ErrContract
	}
	if err := runOpenAI(ctx, out, filepath.Join(dir, "worker-password"), password); err != nil {
		return s.Metrics(), err
	}
	if err := runMessages(ctx, out, filepath.Join(dir, "worker-password"), password); err != nil {
		return s.Metrics(), err
	}
	if err := runResponses(ctx, out, filepath.Join(dir, "worker-password"), password); err != nil {
		return s.Metrics(), err
	}
	if err := runHosted(ctx, out, filepath.Join(dir, "worker-password"), password,
		"part 5: a hosted agent session on the OpenAI Agents API (a simulator whose session blocks on three get_flight_times calls)",
		config.UpstreamOpenAIAgents); err != nil {
		return s.Metrics(), err
	}
	return s.Metrics(), runHosted(ctx, out, filepath.Join(dir, "worker-password"), password,
		"part 6: a hosted agent session on Anthropic Managed Agents (a simulator whose session blocks on three get_flight_times calls)",
		config.UpstreamAnthropicAgents)
}

const apiKey = "demo-key"

// demoWorker is the embedded server's user the demo workers log in as.
const demoWorker = "demo-workers"

// workerPassword makes a random password for the demo workers and writes
// it where the configuration points (a file, as secrets always are).
func workerPassword(dir string) (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	pw := hex.EncodeToString(b[:])
	return pw, os.WriteFile(filepath.Join(dir, "worker-password"), []byte(pw+"\n"), 0o600)
}

// startSidecar assembles the sidecar from the shipped config.yaml, on the
// embedded NATS server with authentication on (the demo workers are a
// configured user), with every listener on a free loopback port; edit,
// when set, changes the configuration last.
func startSidecar(coreURL, passwordFile string, edit func(*config.Config)) (*sidecar.Sidecar, error) {
	cfg, err := config.Parse(toolsidecar.ExampleConfig)
	if err != nil {
		return nil, err
	}
	cfg.Core.URL = coreURL
	cfg.NATS.Embedded.Listen = "127.0.0.1:-1"
	cfg.NATS.Embedded.Workers = []config.Worker{{Name: demoWorker, PasswordFile: passwordFile, Tools: []string{"*"}}}
	cfg.Server.Listen = "127.0.0.1:0"
	cfg.NATS.DiscoverInterval = 100 * time.Millisecond // the worker's declarations are found at once
	// search_hotels runs 1.5s; a 1s budget, restarted by each progress
	// message, shows progress keeping a long call alive.
	for i := range cfg.Tools {
		if cfg.Tools[i].Name == "search_hotels" {
			cfg.Tools[i].Timeout = time.Second
		}
	}
	// convert_currency lives in an MCP server: this binary again, over
	// stdio, its tools imported from tools/list.
	fx, err := mcpTools()
	if err != nil {
		return nil, err
	}
	cfg.Tools = append(cfg.Tools, fx)
	if edit != nil {
		edit(&cfg)
	}
	return sidecar.Start(context.Background(), cfg, sidecar.WithAPIKey(apiKey))
}

// serve runs the sidecar's HTTP API until stop is called; stop waits for
// its shutdown.
func serve(ctx context.Context, s *sidecar.Sidecar) (stop func()) {
	runCtx, cancel := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- s.Run(runCtx) }()
	return func() {
		cancel()
		<-ran
	}
}

// startWorkers serves the demo tools from their own NATS connection, as a
// worker process would.
func startWorkers(s *sidecar.Sidecar, password string) (stop func(), err error) {
	nc, err := nats.Connect(s.NATSURL(), nats.Name("demo-workers"), nats.UserInfo(demoWorker, password))
	if err != nil {
		return nil, err
	}
	w := worker.New(nc, config.Default().NATS.SubjectPrefix)
	err = Workers(w)
	if err == nil {
		err = w.Start()
	}
	if err != nil {
		nc.Close()
		return nil, err
	}
	stop = func() { _ = w.Stop(context.Background()); nc.Close() }
	// The run starts once the sidecar serves the tools the worker declares.
	for deadline := time.Now().Add(10 * time.Second); !declared(s); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("demo: the sidecar did not discover the worker's tools %v", Declared)
		}
	}
	return stop, nil
}

// declared reports that the sidecar serves the demo worker's declarations.
func declared(s *sidecar.Sidecar) bool {
	for _, name := range Declared {
		if t, ok := s.Tools().Lookup(name); !ok || len(t.DeclaredBy) == 0 {
			return false
		}
	}
	return true
}

// setUp creates what an application creates before it drives a run: an
// assistant with the tools, a thread, the user's message and the run.
func setUp(ctx context.Context, coreURL string, tools []tool.FunctionTool) (executor.Request, error) {
	cc, err := core.New(core.Config{URL: coreURL, APIKey: apiKey})
	if err != nil {
		return executor.Request{}, err
	}
	asst, err := cc.CreateAssistant(ctx, core.AssistantCreate{Name: "travel", Model: "vllm/demo", Tools: tools})
	if err != nil {
		return executor.Request{}, err
	}
	th, err := cc.CreateThread(ctx)
	if err != nil {
		return executor.Request{}, err
	}
	msg, err := cc.CreateMessage(ctx, th.ID, asst.ID, "Plan my trip to New York.")
	if err != nil {
		return executor.Request{}, err
	}
	run, err := cc.CreateRun(ctx, core.RunCreate{AssistantID: asst.ID, ThreadID: th.ID})
	if err != nil {
		return executor.Request{}, err
	}
	return executor.Request{RunID: run.ID, ThreadID: th.ID, AssistantID: asst.ID, MessageID: msg.ID, Model: "vllm/demo"}, nil
}

// transcript prints events as they happen, with times from the start.
type transcript struct {
	out io.Writer
	t0  time.Time
	mu  sync.Mutex
	// per turn: the first dispatch and the last submitted outcome
	first, last map[int]time.Time
}

func (t *transcript) at() string { return fmt.Sprintf("[%7s]", ms(time.Since(t.t0))) }

// say prints a line of the transcript.
func (t *transcript) say(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fmt.Fprintf(t.out, "%s   %s\n", t.at(), line)
}

func (t *transcript) event(e executor.Event) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch e.Type {
	case executor.EventTurn:
		fmt.Fprintf(t.out, "%s turn %d\n", t.at(), e.Turn)
	case executor.EventReasoning:
		fmt.Fprintf(t.out, "%s   reasoning: %s\n", t.at(), e.Text)
	case executor.EventContent:
		fmt.Fprintf(t.out, "%s   content:   %s\n", t.at(), strings.ReplaceAll(e.Text, "\n", "\n                       "))
	case executor.EventError:
		fmt.Fprintf(t.out, "%s   error:     %s\n", t.at(), e.Text)
	case executor.EventToolCall:
		if _, ok := t.first[e.Turn]; !ok {
			t.first[e.Turn] = time.Now()
		}
		fmt.Fprintf(t.out, "%s   → %-17s %s dispatched\n", t.at(), e.Call.Tool, e.Call.ToolCallID)
	case executor.EventApprovalRequired:
		fmt.Fprintf(t.out, "%s   ? %-17s %s waits for approval: %s\n", t.at(), e.Call.Tool, e.Call.ToolCallID, e.Approval.Arguments)
	case executor.EventToolResult:
		t.last[e.Turn] = time.Now()
		c := e.Call
		status, problems := outcome(*c)
		fmt.Fprintf(t.out, "%s   ← %-17s %s %6dms attempts=%d  %s\n", t.at(), c.Tool, c.ToolCallID, c.DurationMS, c.Attempts, status)
		for _, p := range problems {
			fmt.Fprintf(t.out, "%s                         %s\n", strings.Repeat(" ", 9), p)
		}
		if c.OK {
			fmt.Fprintf(t.out, "%s                       %s\n", strings.Repeat(" ", 9), c.Output)
		}
	}
}

func (t *transcript) summary(s executor.Summary) {
	byTurn := map[int][]executor.CallResult{}
	for _, c := range s.Calls {
		byTurn[c.Turn] = append(byTurn[c.Turn], c)
	}
	fmt.Fprintf(t.out, "\n%s run %s: %s after %d turns\n", t.at(), s.RunID, s.Status, s.Turns)
	for turn := 1; turn <= s.Turns; turn++ {
		cs := byTurn[turn]
		if len(cs) == 0 {
			continue
		}
		var sum, longest int64
		var failed int
		for _, c := range cs {
			sum += c.DurationMS
			longest = max(longest, c.DurationMS)
			if !c.OK {
				failed++
			}
		}
		fmt.Fprintf(t.out, "batch of turn %d: %d calls (%d ok, %d error outcomes), all submitted in call order; "+
			"joined in %dms from the first dispatch to the last submission; longest call %dms; "+
			"the calls add up to %dms (one by one, as the legacy loop runs them, the batch would take that long)\n",
			turn, len(cs), len(cs)-failed, failed, t.last[turn].Sub(t.first[turn]).Milliseconds(), longest, sum)
	}
	fmt.Fprintf(t.out, "final answer:\n  %s\n", strings.ReplaceAll(s.Content, "\n", "\n  "))
}

// outcome is a call's outcome for its row ("ok", or the error type and
// the error's first line) and the problems a validation error lists after
// that line, one a line, each printed on a line of its own under the row.
func outcome(c executor.CallResult) (status string, problems []string) {
	if c.OK {
		return "ok", nil
	}
	first, rest, _ := strings.Cut(c.Error, "\n")
	for line := range strings.Lines(rest) {
		problems = append(problems, strings.TrimRight(line, "\n"))
	}
	return c.ErrorType + ": " + first, problems
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3fs", d.Seconds()) }
