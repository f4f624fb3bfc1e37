package live

import (
	"context"
	"embed"
	"encoding/json"
	"io/fs"
	"log/slog"
	"net/http"
	"reflect"
	"slices"
	"time"

	sse "github.com/tmaxmax/go-sse"

	"github.com/projectdavid/toolsidecar/approval"
)

//go:embed static
var static embed.FS

// Config configures the view's handlers.
type Config struct {
	Board *Board
	// Access decides the runs each page sees, and the pending approvals:
	// those its credentials own, as the runs (every one for the operator).
	Access    Access
	Approvals approval.Store
	// Refresh is how often a page is sent the pending approvals even when
	// this sidecar saw no change: another sidecar of the cluster may have
	// opened or decided one. default: 5s
	Refresh time.Duration
	// Keepalive is how often a quiet stream sends a comment. default: 15s
	Keepalive time.Duration
	// TraceURL links a run to its trace: {trace_id} is replaced by the
	// run's (server.ui_trace_url). "": no link.
	TraceURL string
	Logger   *slog.Logger
}

// Pages serves the page, its script and its style (GET /ui, /ui/...). They
// carry no data: the server may serve them without the API token.
func Pages() http.Handler {
	sub, _ := fs.Sub(static, "static")
	files := http.StripPrefix("/ui", http.FileServerFS(sub)) // /ui itself is the index
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		// Nothing but the sidecar itself, and never in a frame: the
		// Approve button must not be clickjacked.
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}

// Events streams the board over SSE (GET /ui/events): a snapshot event
// with every run kept and the pending approvals, then a run event per
// changed run and an approvals event when they change; of each, what the
// request may see (Config.Access).
func Events(cfg Config) http.Handler {
	if cfg.Refresh <= 0 {
		cfg.Refresh = 5 * time.Second
	}
	if cfg.Keepalive <= 0 {
		cfg.Keepalive = 15 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).SetWriteDeadline(time.Time{}) // a stream outlives the server's write timeout
		sess, err := sse.Upgrade(w, r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		s := &stream{cfg: cfg, sess: sess, ctx: r.Context(), viewer: cfg.Access.viewer(r)}
		s.run()
	})
}

// stream is one page's event stream.
type stream struct {
	cfg     Config
	sess    *sse.Session
	ctx     context.Context
	viewer  viewer
	pending []approval.Entry // as last sent
}

func (s *stream) send(typ string, v any) bool {
	data, err := json.Marshal(v)
	if err != nil {
		return false
	}
	m := &sse.Message{Type: sse.Type(typ)}
	m.AppendData(string(data))
	return s.sess.Send(m) == nil && s.sess.Flush() == nil
}

// approvals lists the pending approvals; ok is false when the store
// failed (the page keeps what it has).
func (s *stream) approvals() ([]approval.Entry, bool) {
	if s.cfg.Approvals == nil {
		return []approval.Entry{}, true
	}
	es, err := s.cfg.Approvals.Pending(s.ctx)
	if err != nil {
		s.cfg.Logger.Warn("live view: listing approvals failed", "err", err)
		return nil, false
	}
	if s.viewer.all {
		return es, true
	}
	// A caller's page shows the approvals of its own runs, of any
	// sidecar that shares the store: another's carry that run's arguments.
	return slices.DeleteFunc(es, func(e approval.Entry) bool { return !s.viewer.owns(e.Owner) }), true
}

func (s *stream) run() {
	w, stop := s.cfg.Board.watch()
	defer stop()
	s.pending, _ = s.approvals()
	snap := map[string]any{"runs": s.viewer.runs(s.cfg.Board.snapshot()), "approvals": s.pending, "now": time.Now().UnixMilli()}
	if s.cfg.TraceURL != "" {
		snap["trace_url"] = s.cfg.TraceURL
	}
	if !s.send("snapshot", snap) {
		return
	}
	refresh := time.NewTicker(s.cfg.Refresh)
	defer refresh.Stop()
	keepalive := time.NewTicker(s.cfg.Keepalive)
	defer keepalive.Stop()
	for {
		refreshApprovals := false
		select {
		case <-s.ctx.Done():
			return
		case <-s.cfg.Board.closed:
			return // the server shuts down; the page reconnects to the next one
		case <-keepalive.C:
			m := &sse.Message{}
			m.AppendComment("keepalive")
			if s.sess.Send(m) != nil || s.sess.Flush() != nil {
				return
			}
			continue
		case <-refresh.C:
			refreshApprovals = true
		case <-w.wake:
		}
		runs, changed := s.cfg.Board.changes(w)
		for _, r := range s.viewer.runs(runs) {
			if !s.send("run", r) {
				return
			}
		}
		if changed || refreshApprovals {
			if es, ok := s.approvals(); ok && !reflect.DeepEqual(es, s.pending) {
				s.pending = es
				if !s.send("approvals", es) {
					return
				}
			}
		}
	}
}
