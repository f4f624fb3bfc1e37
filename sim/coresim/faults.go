package coresim

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Fault makes the simulator misbehave on matching requests, the way a real
// Core or the network between does, so that a client's recovery can be
// tested: answer with an error status (before or after the write took
// effect), answer late, or drop the connection.
type Fault struct {
	// Method and Path select requests: the method, and a path prefix such
	// as /v1/messages/tools or /v1/actions/, or, ending in $, a whole path
	// (/v1/runs$: the listing of runs, not one run).
	Method string `yaml:"method" json:"method"`
	Path   string `yaml:"path" json:"path"`
	// Times is how many matching requests get the fault. default: 1
	Times int `yaml:"times" json:"times"`
	// Status answers with this HTTP status.
	Status int `yaml:"status" json:"status"`
	// RetryAfter is sent as the Retry-After header with Status.
	RetryAfter string `yaml:"retry_after" json:"retry_after"`
	// Store lets the request take effect first; the fault is in the answer.
	Store bool `yaml:"store" json:"store"`
	// Delay is slept before answering (after the write, with Store).
	Delay time.Duration `yaml:"delay" json:"delay"`
	// Drop closes the connection without an answer.
	Drop bool `yaml:"drop" json:"drop"`
	// Hold is slept before the request takes effect, whatever its client
	// does meanwhile: a Core that applies a write late, perhaps after its
	// client gave up on it and sent the call's next write.
	Hold time.Duration `yaml:"hold" json:"hold"`
	// Hit, when set, is called as each matching request starts its fault
	// (after the write, with Store): a test's signal that the client is
	// now at that point, to kill it there.
	Hit func() `yaml:"-" json:"-"`
}

type activeFault struct {
	Fault
	left int
}

// AddFault arms a fault for the next matching requests.
func (s *Sim) AddFault(f Fault) {
	if f.Times < 1 {
		f.Times = 1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, &activeFault{Fault: f, left: f.Times})
}

// Holding counts the requests a Hold fault holds and has not yet let take
// effect: a test waits for none before it reads the contract log, since a
// held write may be applied after its client has finished.
func (s *Sim) Holding() int { return int(s.holding.Load()) }

// ClearFaults disarms every fault: Core is healthy again.
func (s *Sim) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = nil
}

// takeFault returns the first armed fault matching r, counting it down.
func (s *Sim) takeFault(r *http.Request) *Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.faults {
		if f.left > 0 && strings.EqualFold(f.Method, r.Method) && f.matches(r.URL.Path) {
			f.left--
			out := f.Fault
			return &out
		}
	}
	return nil
}

func (f *Fault) matches(path string) bool {
	if whole, ok := strings.CutSuffix(f.Path, "$"); ok {
		return path == whole
	}
	return strings.HasPrefix(path, f.Path)
}

// serveFault answers r as f says.
func (s *Sim) serveFault(w http.ResponseWriter, r *http.Request, f *Fault) {
	if f.Hold > 0 {
		s.holding.Add(1)
		defer s.holding.Add(-1) // after the request took effect
		time.Sleep(f.Hold)
	}
	var stored *recorder
	if f.Store {
		stored = &recorder{header: http.Header{}, status: http.StatusOK}
		s.mux.ServeHTTP(stored, r)
	}
	if f.Hit != nil {
		f.Hit()
	}
	if f.Delay > 0 {
		t := time.NewTimer(f.Delay)
		select {
		case <-r.Context().Done():
		case <-t.C:
		}
		t.Stop()
	}
	switch {
	case f.Drop:
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				conn.Close()
				return
			}
		}
		panic(http.ErrAbortHandler) // closes the connection all the same
	case f.Status != 0:
		if f.RetryAfter != "" {
			w.Header().Set("Retry-After", f.RetryAfter)
		}
		detail(w, f.Status, fmt.Sprintf("coresim: scripted fault %d", f.Status))
	case stored != nil:
		for k, v := range stored.header {
			w.Header()[k] = v
		}
		w.WriteHeader(stored.status)
		w.Write(stored.body.Bytes())
	default:
		s.mux.ServeHTTP(w, r)
	}
}

// recorder keeps a handler's answer so that a fault can replace it. It is a
// plain http.ResponseWriter: the simulator links no test package.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) Write(p []byte) (int, error) { return r.body.Write(p) }
func (r *recorder) WriteHeader(status int)      { r.status = status }
