package registry_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/registry"
)

// Example compiles a tool and validates a model's arguments against its
// schema; the error is written for the model to read.
func Example() {
	cfg := config.Default()
	cfg.Tools = []config.Tool{{
		Name: "get_flight_times", Route: "nats", Timeout: 30 * time.Second, SideEffects: config.ReadOnly,
		Parameters: map[string]any{
			"type":     "object",
			"required": []any{"departure", "arrival"},
			"properties": map[string]any{
				"departure": map[string]any{"type": "string"},
				"arrival":   map[string]any{"type": "string"},
			},
		},
	}}
	reg, err := registry.New(context.Background(), cfg, registry.Base(nil))
	if err != nil {
		panic(err)
	}
	tool, _ := reg.Lookup("get_flight_times")
	fmt.Println(tool.Subject)
	fmt.Println(tool.Validate(json.RawMessage(`{"departure": "LAX", "arrival": "JFK"}`)))
	fmt.Println(tool.Validate(json.RawMessage(`{"departure": "LAX"}`)))
	// Output:
	// toolsidecar.tools.get_flight_times
	// <nil>
	// invalid arguments for tool "get_flight_times":
	// - at /: missing property 'arrival'
}
