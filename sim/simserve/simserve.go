// Package simserve serves one of the project's simulators over HTTP, for a
// person to try the sidecar by hand with no model account and no Core:
// "toolsidecar sim" and the coresim command both run it.
//
// One script format serves every kind: coresim's scenario (a YAML file of
// turns, each with its calls or its content). The model-API simulators
// play its calls turn by turn, then the last turn's content, in which
// "{{results}}" stands for the last turn's results. The hosted-agent
// simulators (openai-agents, anthropic-agents) play it in each session
// whose input is a person's question rather than a script of its own.
package simserve

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/projectdavid/toolsidecar/sim/agentssim"
	"github.com/projectdavid/toolsidecar/sim/anthropicsim"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/sim/internal/simbase"
	"github.com/projectdavid/toolsidecar/sim/managedsim"
	"github.com/projectdavid/toolsidecar/sim/openaisim"
	"github.com/projectdavid/toolsidecar/sim/responsesim"
)

// Kinds are the simulators, named as the upstream.kind each stands in for.
var Kinds = []string{"core", "openai", "responses", "anthropic", "openai-agents", "anthropic-agents"}

// Options configure a simulator.
type Options struct {
	// Kind is one of [Kinds].
	Kind string
	// Listen is the address served; default: [DefaultListen].
	Listen string
	// Script is a scenario file; default: coresim.DefaultScenario, which
	// calls get_flight_times, the tool the example worker declares.
	Script string
	// APIKey, when set, is required of Core's clients (X-API-Key).
	APIKey string
	// SplitWrites, MaxLatency: Core only, as in coresim.Config.
	SplitWrites bool
	MaxLatency  time.Duration
	// KeepAlive closes a kept connection idle this long; 0: net/http's.
	KeepAlive time.Duration
}

// DefaultListen is the address a kind serves by default: Core's is the
// one the shipped config.yaml names as core.url.
func DefaultListen(kind string) string {
	return map[string]string{
		"core": "127.0.0.1:9000", "openai": "127.0.0.1:9001",
		"responses": "127.0.0.1:9002", "anthropic": "127.0.0.1:9003",
		"openai-agents": "127.0.0.1:9004", "anthropic-agents": "127.0.0.1:9005",
	}[kind]
}

// basePath is where the kind's API lives under the server's URL: the
// upstream.url a sidecar is given.
func basePath(kind string) string {
	if kind == "openai" || kind == "responses" || kind == "openai-agents" {
		return "/v1"
	}
	return ""
}

// Handler builds the simulator o asks for and says which script it plays.
func Handler(o Options) (http.Handler, string, error) {
	if !slices.Contains(Kinds, o.Kind) {
		return nil, "", fmt.Errorf("no simulator of kind %q: one of %v", o.Kind, Kinds)
	}
	sc := coresim.DefaultScenario()
	if o.Script != "" {
		var err error
		if sc, err = coresim.LoadScenario(o.Script); err != nil {
			return nil, "", err
		}
	}
	if o.Kind == "core" {
		return coresim.New(coresim.Config{Scenario: sc, APIKey: o.APIKey, SplitWrites: o.SplitWrites,
			MaxLatency: o.MaxLatency, IDPrefix: freshPrefix()}), sc.Name, nil
	}
	script, err := modelScript(sc)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", o.Script, err)
	}
	switch o.Kind {
	case "openai":
		return openaisim.New(openaisim.Config{Model: openaisim.Play(script)}), sc.Name, nil
	case "responses":
		return responsesim.New(responsesim.Config{Model: responsesim.Play(script)}), sc.Name, nil
	case "openai-agents":
		return agentssim.New(agentssim.Config{Script: script}), sc.Name, nil
	case "anthropic-agents":
		return managedsim.New(managedsim.Config{Script: script}), sc.Name, nil
	}
	return anthropicsim.New(anthropicsim.Config{APIKey: o.APIKey, Model: anthropicsim.Play(script)}), sc.Name, nil
}

// freshPrefix is six random hex digits: a Core simulator started again
// issues ids that no earlier start issued, so that runs of successive
// simulators stay apart in a sidecar's ledger and live view.
func freshPrefix() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// modelScript turns a scenario into the model-API simulators' script:
// every turn but the last makes calls, the last one answers. What only
// Core can do (in-band errors, dropped streams, faults) is refused.
func modelScript(sc coresim.Scenario) (simbase.Script, error) {
	type call struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments,omitempty"`
		Raw       *string         `json:"raw_arguments,omitempty"`
	}
	var rounds [][]call
	if len(sc.Faults) > 0 {
		return simbase.Script{}, errors.New("faults are Core's: the model-API simulators take turns only")
	}
	last := len(sc.Turns) - 1
	for i, t := range sc.Turns {
		switch {
		case t.Error != "" || t.RouterError != "" || t.DropAfter != 0 || t.HTTPStatus != 0 || len(t.When) > 0:
			return simbase.Script{}, fmt.Errorf("turn %d: error, router_error, drop_after, http_status and when are Core's: the model-API simulators take calls and content", i+1)
		case i < last && len(t.Calls) == 0:
			return simbase.Script{}, fmt.Errorf("turn %d has no calls: the model-API simulators make calls every turn but the last, which answers", i+1)
		case i == last && len(t.Calls) > 0:
			return simbase.Script{}, fmt.Errorf("turn %d, the last, makes calls: the last turn answers (content)", i+1)
		}
		if i == last {
			break
		}
		round := make([]call, len(t.Calls))
		for k, c := range t.Calls {
			round[k].Name = c.Tool
			switch {
			case c.ArgsJSON != "" && json.Valid([]byte(c.ArgsJSON)):
				round[k].Arguments = json.RawMessage(c.ArgsJSON)
			case c.ArgsJSON != "":
				round[k].Raw = &c.ArgsJSON
			default:
				args, err := json.Marshal(c.Args)
				if err != nil || c.Args == nil {
					args = []byte("{}")
				}
				round[k].Arguments = args
			}
		}
		rounds = append(rounds, round)
	}
	answer := sc.Turns[last].Content
	if answer == "" {
		answer = simbase.ResultsMark
	}
	raw, _ := json.Marshal(map[string]any{"rounds": rounds, "answer": answer})
	script, ok := simbase.ParseScript(string(raw))
	if !ok {
		return simbase.Script{}, errors.New("a script with no calls: the model-API simulators need a turn of calls before the answer")
	}
	return script, nil
}

// Serve serves the simulator until ctx ends. Once it listens it prints
// one line to out: where it serves, and the flags that point a sidecar
// at it.
func Serve(ctx context.Context, o Options, out io.Writer) error {
	h, name, err := Handler(o)
	if err != nil {
		return err
	}
	if o.Listen == "" {
		o.Listen = DefaultListen(o.Kind)
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: o.KeepAlive}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	url := "http://" + ln.Addr().String() + basePath(o.Kind)
	if o.Kind == "core" {
		fmt.Fprintf(out, "sim core: serving %s, script %q; a sidecar reaches it with --set core.url=%s\n", url, name, url)
	} else {
		fmt.Fprintf(out, "sim %s: serving %s, script %q; a sidecar reaches it with --set upstream.kind=%s --set upstream.url=%s\n", o.Kind, url, name, o.Kind, url)
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	<-errc
	return nil
}
