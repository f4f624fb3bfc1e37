package logging

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// TestDurationsAndTraceIDs: a duration is written as Go writes it, and a
// record logged inside a span carries that span's ids; one outside, none.
func TestDurationsAndTraceIDs(t *testing.T) {
	var buf bytes.Buffer
	log, err := New(&buf, "json", 0)
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	ctx, span := tp.Tracer("t").Start(context.Background(), "s")
	log.With("component", "x").InfoContext(ctx, "inside", "took", 1500*time.Millisecond)
	span.End()
	log.Info("outside")
	dec := json.NewDecoder(&buf)
	var in, out map[string]any
	if err := dec.Decode(&in); err != nil {
		t.Fatal(err)
	}
	dec.Decode(&out)
	if in["took"] != "1.5s" || in["trace_id"] != span.SpanContext().TraceID().String() || in["span_id"] != span.SpanContext().SpanID().String() {
		t.Errorf("inside the span: %v", in)
	}
	if _, has := out["trace_id"]; has {
		t.Errorf("outside any span: %v", out)
	}
	if _, err := New(&buf, "xml", 0); err == nil {
		t.Error("format xml accepted")
	}
}

// TestHeldAttrsLogAsWith: attributes held back by With come out as the
// JSON handler's own With writes them: same keys, values, order and
// groups, for every shape of With and WithGroup below.
func TestHeldAttrsLogAsWith(t *testing.T) {
	shapes := map[string]func(*slog.Logger){
		"nested With":          func(l *slog.Logger) { l.With("run_id", "r1").With("tool_call_id", "c1", "n", 2).Info("m", "k", "v") },
		"With, group, With":    func(l *slog.Logger) { l.With("a", 1).WithGroup("g").With("b", 2).Info("m", "c", 3) },
		"group first":          func(l *slog.Logger) { l.WithGroup("g").With("b", "x").Warn("m") },
		"With of a group attr": func(l *slog.Logger) { l.With(slog.Group("req", "id", 7)).Error("m", "err", "boom") },
	}
	for name, logIt := range shapes {
		t.Run(name, func(t *testing.T) {
			var got, want bytes.Buffer
			log, _ := New(&got, "json", 0)
			logIt(log)
			logIt(slog.New(slog.NewJSONHandler(&want, nil)))
			g, w := withoutTime(t, got.Bytes()), withoutTime(t, want.Bytes())
			if g != w {
				t.Errorf("logged %s, the JSON handler's With writes %s", g, w)
			}
		})
	}
}

// withoutTime is a JSON log line without its time field, keys in order.
func withoutTime(t *testing.T, line []byte) string {
	t.Helper()
	i := bytes.Index(line, []byte(`"level"`))
	if i < 0 {
		t.Fatalf("no level in %s", line)
	}
	return string(bytes.TrimSpace(line[i:]))
}

// counting counts what reaches the handler under traced.
type counting struct {
	slog.Handler
	withAttrs int
	last      []string
}

func (c *counting) Enabled(context.Context, slog.Level) bool { return true }
func (c *counting) WithAttrs(as []slog.Attr) slog.Handler    { c.withAttrs++; return c }
func (c *counting) Handle(_ context.Context, r slog.Record) error {
	c.last = nil
	r.Attrs(func(a slog.Attr) bool { c.last = append(c.last, a.String()); return true })
	return nil
}

// TestWithFormatsNothing: a logger made by With hands nothing to the
// handler until it logs, and then hands its attributes first.
func TestWithFormatsNothing(t *testing.T) {
	c := &counting{Handler: slog.DiscardHandler}
	log := slog.New(traced{h: c}).With("run_id", "r1").With("tool_call_id", "c1")
	if c.withAttrs != 0 {
		t.Fatalf("With reached the handler %d times before anything was logged", c.withAttrs)
	}
	log.Info("m", "k", "v")
	if c.withAttrs != 0 || strings.Join(c.last, " ") != "run_id=r1 tool_call_id=c1 k=v" {
		t.Errorf("handler saw %d WithAttrs and the attributes %q", c.withAttrs, c.last)
	}
}
