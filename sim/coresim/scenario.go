package coresim

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Scenario scripts the model. Completions request k of a run plays Turns[k]
// (or the first of its branches whose condition matches the tool results the
// model would see). A request past the end gets an in-band error.
type Scenario struct {
	Name  string `yaml:"name" json:"name"`
	Turns []Turn `yaml:"turns" json:"turns"`
	// Faults are armed when the simulator starts.
	Faults []Fault `yaml:"faults" json:"faults"`
}

// Turn is what one completions response emits.
type Turn struct {
	// Reasoning and Content are streamed before any tool call. In Content,
	// "{{results}}" becomes the tool results of the context, merged as Core
	// merges consecutive tool messages.
	Reasoning string `yaml:"reasoning" json:"reasoning"`
	Content   string `yaml:"content" json:"content"`
	// Calls is the batch: one manifest per call, in this order.
	Calls []Call `yaml:"calls" json:"calls"`
	// Error is an in-band worker error chunk ({"type": "error", "content"});
	// [DONE] still follows, and no call is emitted.
	Error string `yaml:"error" json:"error"`
	// RouterError ends the stream with the router's exception frame
	// ({"type": "error", "message"}) and no [DONE].
	RouterError string `yaml:"router_error" json:"router_error"`
	// DropAfter closes the connection after that many frames, without [DONE].
	DropAfter int `yaml:"drop_after" json:"drop_after"`
	// FrameDelay is slept before every frame.
	FrameDelay time.Duration `yaml:"frame_delay" json:"frame_delay"`
	// HTTPStatus, when set, answers the request with that status and no
	// stream.
	HTTPStatus int `yaml:"http_status" json:"http_status"`
	// When lists alternatives tried in order before this turn's own script.
	When []Branch `yaml:"when" json:"when"`
}

// Branch replaces a turn when the tool results of the context contain a
// string.
type Branch struct {
	ResultContains string `yaml:"result_contains" json:"result_contains"`
	Turn           Turn   `yaml:"turn" json:"turn"`
}

// Call is one scripted tool call.
type Call struct {
	// ID is the model's call id; default call_ + 8 hex digits.
	ID   string `yaml:"id" json:"id"`
	Tool string `yaml:"tool" json:"tool"`
	// Args is a YAML or JSON object (keys sorted on the wire); ArgsJSON is
	// raw JSON text sent as written, key order kept. A non-JSON ArgsJSON is
	// coerced to {"raw": text} as Core coerces it.
	Args     map[string]any `yaml:"args" json:"args"`
	ArgsJSON string         `yaml:"args_json" json:"args_json"`
	// RawTool and RawArgs, when set, replace the manifest's "tool" and
	// "args" values with this text verbatim, valid JSON or not: a
	// malformed manifest whose Action Core still created.
	RawTool string `yaml:"raw_tool" json:"raw_tool"`
	RawArgs string `yaml:"raw_args" json:"raw_args"`
	// ActionID, when set, replaces the Action id Core would mint: a
	// hostile or broken Core's (too long, or with '.' and '*').
	ActionID string `yaml:"action_id" json:"action_id"`
}

func (c Call) argsJSON() json.RawMessage {
	if c.ArgsJSON != "" {
		return json.RawMessage(c.ArgsJSON)
	}
	if c.Args == nil {
		return json.RawMessage("{}")
	}
	b, err := json.Marshal(c.Args)
	if err != nil {
		return json.RawMessage("{}")
	}
	return b
}

// pick returns the branch that matches results, or t itself.
func (t Turn) pick(results string) Turn {
	for _, b := range t.When {
		if results != "" && strings.Contains(results, b.ResultContains) {
			return b.Turn
		}
	}
	return t
}

// LoadScenario reads a scenario from a YAML or JSON file.
func LoadScenario(path string) (Scenario, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Scenario{}, fmt.Errorf("coresim: reading scenario: %w", err)
	}
	return ParseScenario(data)
}

// ParseScenario decodes a scenario; unknown keys are errors.
func ParseScenario(data []byte) (Scenario, error) {
	var sc Scenario
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&sc); err != nil {
		return Scenario{}, fmt.Errorf("coresim: parsing scenario: %w", err)
	}
	if len(sc.Turns) == 0 {
		return Scenario{}, fmt.Errorf("coresim: scenario %q has no turns", sc.Name)
	}
	return sc, nil
}

// DefaultScenario is the flight-times conversation of the demos: a batch
// of three calls, then an answer that quotes the merged results.
func DefaultScenario() Scenario {
	return Scenario{Name: "flights", Turns: []Turn{
		{
			Reasoning: "I need flight times for three routes.",
			Calls: []Call{
				{Tool: "get_flight_times", ArgsJSON: `{"departure": "LAX", "arrival": "JFK"}`},
				{Tool: "get_flight_times", ArgsJSON: `{"departure": "SFO", "arrival": "ORD"}`},
				{Tool: "get_flight_times", ArgsJSON: `{"departure": "SEA", "arrival": "BOS"}`},
			},
		},
		{Content: "Here are the flight times: {{results}}"},
	}}
}
