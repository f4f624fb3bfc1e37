package registry

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/projectdavid/toolsidecar/config"
)

func flights() config.Tool {
	return config.Tool{Name: "get_flight_times", Description: "d", Timeout: time.Second, Route: "nats", SideEffects: config.ReadOnly,
		Parameters: map[string]any{
			"type": "object", "required": []any{"departure", "arrival"},
			"properties": map[string]any{
				"departure":  map[string]any{"type": "string", "pattern": "^[A-Z]{3}$"},
				"arrival":    map[string]any{"type": "string", "pattern": "^[A-Z]{3}$"},
				"passengers": map[string]any{"type": "integer", "minimum": 1},
			},
		}}
}

func TestValidate(t *testing.T) {
	r, err := New([]config.Tool{flights()}, "p")
	if err != nil {
		t.Fatal(err)
	}
	tool, ok := r.Lookup("get_flight_times")
	if !ok || tool.Subject != "p.get_flight_times" {
		t.Fatalf("lookup %+v", tool)
	}
	if err := tool.Validate(json.RawMessage(`{"departure": "LAX", "arrival": "JFK"}`)); err != nil {
		t.Fatalf("valid args rejected: %v", err)
	}
	cases := []struct {
		args string
		want []string
	}{
		{`{"departure": "LAX"}`, []string{"at /: missing property 'arrival'"}},
		{`{"departure": "lax", "arrival": "JFK", "passengers": 0}`, []string{"at /departure:", "does not match pattern", "at /passengers:", "minimum"}},
		{`"LAX to JFK"`, []string{"at /: arguments must be a JSON object"}},
		{`{"departure": `, []string{"not valid JSON"}},
		{``, []string{"must be a JSON object"}},
	}
	for _, tc := range cases {
		err := tool.Validate(json.RawMessage(tc.args))
		var ae *ArgsError
		if !errors.As(err, &ae) || !errors.Is(err, ErrInvalidArgs) {
			t.Errorf("%s: err %v, want *ArgsError", tc.args, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q lacks %q", tc.args, err.Error(), w)
			}
		}
		if !strings.HasPrefix(err.Error(), `invalid arguments for tool "get_flight_times":`) {
			t.Errorf("message %q does not name the tool", err.Error())
		}
	}
}

func TestNewErrors(t *testing.T) {
	bad := flights()
	bad.Name = "bad"
	bad.Parameters = map[string]any{"type": "object", "properties": map[string]any{"x": map[string]any{"type": "strng"}}}
	cases := []struct {
		tools []config.Tool
		want  string
	}{
		{[]config.Tool{flights(), flights()}, `tools[1].name: duplicate tool name "get_flight_times"`},
		{[]config.Tool{{Name: "x", Route: "carrier-pigeon"}}, `tools[0].route: unknown route "carrier-pigeon"`},
		{[]config.Tool{flights(), bad}, "tools[1].parameters"},
	}
	for _, tc := range cases {
		_, err := New(tc.tools, "p")
		if !errors.Is(err, ErrInvalidTool) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("err %v, want %q", err, tc.want)
		}
	}
}

func TestListsAndLive(t *testing.T) {
	noParams := config.Tool{Name: "ping", Route: "nats"}
	r, err := New([]config.Tool{flights(), noParams}, "p")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(r.Names(), ","); got != "get_flight_times,ping" {
		t.Errorf("names %s", got)
	}
	ft := r.FunctionTools()
	if len(ft) != 2 || ft[0].Type != "function" || ft[0].Function.Name != "get_flight_times" || !strings.Contains(string(ft[0].Function.Parameters), `"required":["departure","arrival"]`) {
		t.Errorf("function tools %+v", ft)
	}
	if string(ft[1].Function.Parameters) != `{"type":"object"}` {
		t.Errorf("default schema %s", ft[1].Function.Parameters)
	}
	if _, ok := r.Lookup("nope"); ok {
		t.Error("unknown tool found")
	}
	l := NewLive(r)
	r2, _ := New([]config.Tool{noParams}, "p")
	l.Store(r2)
	if len(l.Load().Names()) != 1 {
		t.Error("Live did not swap")
	}
}

func TestRegisterRoute(t *testing.T) {
	kind := fmt.Sprintf("test-kind-%d", time.Now().UnixNano()) // kinds are global: unique per run
	RegisterRoute(kind, func(tc config.Tool) error {
		if tc.Exec["command"] == nil {
			return errors.New("exec.command: must be set")
		}
		return nil
	})
	if _, err := New([]config.Tool{{Name: "x", Route: kind, Exec: map[string]any{"command": "ls"}}}, "p"); err != nil {
		t.Fatal(err)
	}
	if _, err := New([]config.Tool{{Name: "x", Route: kind}}, "p"); !errors.Is(err, ErrInvalidTool) || !strings.Contains(err.Error(), "tools[0].exec.command: must be set") {
		t.Fatalf("route check: %v", err)
	}
	defer func() {
		if recover() == nil {
			t.Error("duplicate kind did not panic")
		}
	}()
	RegisterRoute(kind, func(config.Tool) error { return nil })
}
