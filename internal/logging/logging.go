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
	return slog.New(traced{h: h}), nil
}

// traced adds the trace and span ids of the record's context. It also
// keeps the attributes of With to itself until a record is logged: the
// JSON and text handlers format them at once, and the sidecar makes
// loggers for every drive and batch, most of which never log. When calls
// had one each too, their formatted attributes held 7-23 MiB of the heap
// at 10,000 runs in profiles (BENCHMARKS.md); calls now add theirs only
// where they log (executor's callLog).
type traced struct {
	h     slog.Handler
	attrs *attrs // nil: none held back
}

// attrs are the attributes of one With, after those of the Withs before.
type attrs struct {
	before *attrs
	as     []slog.Attr
}

// each calls f on every attribute held, the oldest first.
func (a *attrs) each(f func(slog.Attr)) {
	if a == nil {
		return
	}
	a.before.each(f)
	for _, x := range a.as {
		f(x)
	}
}

func (t traced) Enabled(ctx context.Context, l slog.Level) bool { return t.h.Enabled(ctx, l) }

func (t traced) Handle(ctx context.Context, r slog.Record) error {
	if t.attrs != nil { // the held attributes go first, as With's would
		held := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
		t.attrs.each(func(a slog.Attr) { held.AddAttrs(a) })
		r.Attrs(func(a slog.Attr) bool { held.AddAttrs(a); return true })
		r = held
	}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return t.h.Handle(ctx, r)
}

// WithAttrs holds as back; slog hands the slice over to the handler.
func (t traced) WithAttrs(as []slog.Attr) slog.Handler {
	return traced{t.h, &attrs{t.attrs, as}}
}

// WithGroup passes the attributes held to the handler first: they stay
// outside the group.
func (t traced) WithGroup(name string) slog.Handler {
	h := t.h
	if t.attrs != nil {
		var all []slog.Attr
		t.attrs.each(func(a slog.Attr) { all = append(all, a) })
		h = h.WithAttrs(all)
	}
	return traced{h: h.WithGroup(name)}
}
