package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/projectdavid/toolsidecar/bridge"
	"github.com/projectdavid/toolsidecar/embedded"
	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/worker"
)

// Example serves a tool with the Go worker library and calls it the way
// the sidecar does, over a real embedded NATS server with authentication:
// the worker logs in as a user that may serve get_flight_times only, and
// the sidecar connects in process.
func Example() {
	ns, _ := embedded.Start(embedded.Config{Listen: "127.0.0.1:-1", Workers: []embedded.Worker{{
		Name: "flights", Password: "s3cret",
		Subscribe: []string{"toolsidecar.tools.get_flight_times", "toolsidecar.tools.cancel.*"},
	}}})
	defer ns.Shutdown()
	workerConn, _ := nats.Connect(ns.ClientURL(), nats.UserInfo("flights", "s3cret"))
	defer workerConn.Close()
	sidecarConn, _ := nats.Connect(ns.ClientURL(), ns.ConnectOptions()...)
	defer sidecarConn.Close()

	// The worker side: a handler per tool.
	w := worker.New(workerConn, "toolsidecar.tools")
	w.Handle("get_flight_times", func(ctx context.Context, c *tool.Call) ([]byte, error) {
		var args struct{ Departure, Arrival string }
		if err := json.Unmarshal(c.Args, &args); err != nil || args.Arrival == "" {
			return nil, tool.NewError(tool.InvalidArgs, "arrival is required")
		}
		return []byte(`{"route": "` + args.Departure + "-" + args.Arrival + `"}`), nil
	})
	if err := w.Start(); err != nil {
		panic(err)
	}
	defer w.Stop(context.Background())

	// The sidecar side: one attempt of one call.
	client, _ := bridge.Open(sidecarConn, "toolsidecar.tools")
	defer client.Close()
	for _, args := range []string{`{"departure": "LAX", "arrival": "JFK"}`, `{"departure": "LAX"}`} {
		manifest := `{"type": "tool_call_manifest", "run_id": "run_1", "action_id": "act_1", "tool_call_id": "call_1", "tool": "get_flight_times", "args": ` + args + `}`
		reply := client.Dispatch(context.Background(), tool.Request{
			Tool: "get_flight_times", Body: []byte(manifest), ActionID: "act_1", Attempt: 1, Timeout: 5 * time.Second,
		})
		if reply.Err != nil {
			fmt.Println("error:", reply.Err.Type, reply.Err.Message)
			continue
		}
		fmt.Println("result:", string(reply.Data))
	}
	// Output:
	// result: {"route": "LAX-JFK"}
	// error: invalid_args arrival is required
}

// ExampleDeclare declares a tool in the worker's code, as README's five
// minutes show: the sidecar discovers its description, side effects and
// the schema derived from weatherArgs, and needs no configuration entry.
func ExampleDeclare() {
	ns, _ := embedded.Start(embedded.Config{Listen: "127.0.0.1:-1", AllowAnonymous: true})
	defer ns.Shutdown()
	nc, _ := nats.Connect(ns.ClientURL())
	defer nc.Close()

	type weatherArgs struct {
		City string `json:"city" jsonschema:"the city"`
	}
	w := worker.New(nc, "toolsidecar.tools")
	err := worker.Declare(w, "get_weather", worker.Spec{Description: "Weather forecast for a city", SideEffects: tool.ReadOnly},
		func(ctx context.Context, c *tool.Call, a weatherArgs) (map[string]any, error) {
			return map[string]any{"city": a.City, "forecast": "sunny"}, nil
		})
	if err != nil {
		panic(err)
	}
	if err := w.Start(); err != nil {
		panic(err)
	}
	defer w.Stop(context.Background())

	// What the sidecar reads: the endpoint's declaration on $SRV.INFO.
	m, _ := nc.Request("$SRV.INFO", nil, time.Second)
	var info struct {
		Endpoints []struct {
			Metadata map[string]string `json:"metadata"`
		} `json:"endpoints"`
	}
	_ = json.Unmarshal(m.Data, &info)
	fmt.Println(info.Endpoints[0].Metadata["toolsidecar.tool"])
	// Output:
	// {"description":"Weather forecast for a city","parameters":{"type":"object","properties":{"city":{"type":"string","description":"the city"}},"required":["city"],"additionalProperties":false},"side_effects":"read_only"}
}
