// Command go-worker is an example toolsidecar worker in Go: it serves
// get_flight_times on the sidecar's NATS bus with the worker package.
//
//	NATS_URL=nats://127.0.0.1:4222 NATS_USER=flights NATS_PASSWORD=... go run ./examples/go-worker
//
// NATS_USER and NATS_PASSWORD are the worker's user on the sidecar's
// embedded server (nats.embedded.workers in its configuration).
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
	url := os.Getenv("NATS_URL")
	if url == "" {
		url = nats.DefaultURL
	}
	opts := []nats.Option{nats.Name("example-go-worker"), nats.MaxReconnects(-1)}
	if user := os.Getenv("NATS_USER"); user != "" {
		opts = append(opts, nats.UserInfo(user, os.Getenv("NATS_PASSWORD")))
	}
	nc, err := nats.Connect(url, opts...)
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
	log.Info("serving", "tool", "get_flight_times", "nats", url)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = w.Stop(sctx) // finish calls in flight
	_ = nc.Drain()
}
