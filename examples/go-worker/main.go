// Command go-worker is an example toolsidecar worker in Go: it serves
// get_flight_times on the sidecar's NATS bus with the worker package.
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
	"encoding/json"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/projectdavid/toolsidecar/tool"
	"github.com/projectdavid/toolsidecar/worker"
)

type flightArgs struct {
	Departure string `json:"departure"`
	Arrival   string `json:"arrival"`
}

// getFlightTimes is a handler: arguments in, result bytes or an error out.
// A *tool.Error picks the error type the model sees; any other error is a
// tool_error; a panic is reported as worker_crash.
func getFlightTimes(ctx context.Context, c *tool.Call) ([]byte, error) {
	var a flightArgs
	if err := json.Unmarshal(c.Args, &a); err != nil || a.Departure == "" || a.Arrival == "" {
		return nil, tool.NewError(tool.InvalidArgs, "departure and arrival are required")
	}
	for range 3 { // a slow lookup: report progress so the sidecar keeps waiting
		select {
		case <-ctx.Done(): // cancelled by the sidecar, or past the deadline
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if err := c.Progress(); err != nil {
			return nil, err
		}
	}
	return json.Marshal(map[string]any{"route": a.Departure + "-" + a.Arrival, "duration": "5h 35m"})
}

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	nc, err := worker.Connect(nats.Name("example-go-worker"))
	if err != nil {
		log.Error("connect", "err", err)
		os.Exit(1)
	}
	w := worker.New(nc, "toolsidecar.tools", worker.WithConcurrency(32), worker.WithLogger(log))
	w.Handle("get_flight_times", getFlightTimes)
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
