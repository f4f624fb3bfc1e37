// Command go-worker is an example toolsidecar worker in Go: it declares
// get_flight_times in its code (description, side effects, and a schema
// derived from the argument struct) and serves it on the sidecar's NATS
// bus with the worker package. The sidecar discovers the declaration; its
// configuration need not repeat it (config.yaml only sets the tool's
// policies).
//
//	go run ./examples/go-worker
//
// On the machine of a sidecar on its defaults it needs nothing more: it
// reads the credentials the sidecar's embedded NATS server issued. Else
// TOOLSIDECAR_WORKER_CREDENTIALS names that file (the sidecar logs its
// path), or NATS_URL, NATS_USER and NATS_PASSWORD name a server and a user
// (worker.Connect).
package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/nats-io/nats.go"

	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/worker"
)

// flightArgs are the tool's arguments: the schema the model sees is
// derived from them (required unless omitempty; described by the
// jsonschema tag).
type flightArgs struct {
	Departure string `json:"departure" jsonschema:"IATA code of the departure airport"`
	Arrival   string `json:"arrival" jsonschema:"IATA code of the arrival airport"`
}

type flightTimes struct {
	Route    string `json:"route"`
	Duration string `json:"duration"`
}

// getFlightTimes is the tool: the sidecar has checked the arguments against
// the schema. A *tool.Error picks the error type the model sees; any other
// error is a tool_error; a panic is reported as worker_crash.
func getFlightTimes(ctx context.Context, c *tool.Call, a flightArgs) (flightTimes, error) {
	for range 3 { // a slow lookup: report progress so the sidecar keeps waiting
		select {
		case <-ctx.Done(): // cancelled by the sidecar, or past the deadline
			return flightTimes{}, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if err := c.Progress(); err != nil {
			return flightTimes{}, err
		}
	}
	return flightTimes{Route: a.Departure + "-" + a.Arrival, Duration: "5h 35m"}, nil
}

// flightSpec declares the tool: the derived schema, with a pattern that
// struct tags cannot say.
func flightSpec() (worker.Spec, error) {
	params, err := jsonschema.For[flightArgs](nil)
	if err != nil {
		return worker.Spec{}, err
	}
	for _, p := range []string{"departure", "arrival"} {
		params.Properties[p].Pattern = "^[A-Z]{3}$"
	}
	return worker.Spec{Description: "Flight times between two airports", Parameters: params, SideEffects: tool.ReadOnly, Timeout: 30 * time.Second}, nil
}

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	nc, err := worker.Connect(nats.Name("example-go-worker"))
	if err != nil {
		log.Error("connect", "err", err)
		os.Exit(1)
	}
	w := worker.New(nc, "toolsidecar.tools", worker.WithConcurrency(32), worker.WithLogger(log))
	spec, err := flightSpec()
	if err == nil {
		err = worker.Declare(w, "get_flight_times", spec, getFlightTimes)
	}
	if err != nil {
		log.Error("declare", "err", err)
		os.Exit(1)
	}
	if err := w.Start(); err != nil {
		log.Error("start", "err", err)
		os.Exit(1)
	}
	log.Info("serving", "tool", "get_flight_times", "nats", nc.ConnectedUrlRedacted())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = w.Stop(sctx) // finish calls in flight
	_ = nc.Drain()
}
