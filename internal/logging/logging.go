// Package logging builds the daemon's logger: JSON or text, durations as
// strings ("1.5s", not 1500000000), and the trace_id and span_id of the
// span in the record's context, so that a log line and its trace join.
package logging

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"go.opentelemetry.io/otel/trace"
)

// New builds a logger writing format ("json" or "text") to w at level.
func New(w io.Writer, format string, level slog.Level) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Value.Kind() == slog.KindDuration {
			a.Value = slog.StringValue(a.Value.Duration().String())
		}
		return a
	}}
	var h slog.Handler
	switch format {
	case "json":
		h = slog.NewJSONHandler(w, opts)
	case "text":
		h = slog.NewTextHandler(w, opts)
	default:
		return nil, fmt.Errorf("%q is not json or text", format)
	}
	return slog.New(traced{h}), nil
}

// traced adds the trace and span ids of the record's context.
type traced struct{ slog.Handler }

func (t traced) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return t.Handler.Handle(ctx, r)
}

func (t traced) WithAttrs(as []slog.Attr) slog.Handler { return traced{t.Handler.WithAttrs(as)} }
func (t traced) WithGroup(name string) slog.Handler    { return traced{t.Handler.WithGroup(name)} }
