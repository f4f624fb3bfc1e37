package executor

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/projectdavid/toolsidecar/registry"
	"github.com/projectdavid/toolsidecar/tool"
)

// errHedgeLost is the cause of the attempt that lost the race with its
// hedge (or the hedge that lost to it): the worker is told on the cancel
// subject.
var errHedgeLost = errors.New("executor: another copy of the call answered first")

// hedger decides when a read_only tool's straggling attempt is sent a
// second time. Its budget is a token bucket: each call of a hedging tool
// adds ratio tokens (up to a few), each hedge takes one, so hedges stay
// within ratio of those calls over time.
type hedger struct {
	mu     sync.Mutex
	ratio  float64
	tokens float64
	lat    map[string]*latencies
}

// latencies are a tool's recent successful attempt durations.
type latencies struct {
	d    [hedgeWindow]time.Duration
	n, i int
}

const (
	hedgeWindow     = 200 // latencies kept per tool
	hedgeMinSamples = 20  // a percentile needs at least these
	hedgeMaxTokens  = 5   // hedges a quiet pool may have saved up
)

// delay is how long to wait for def's attempt before hedging it; ok is
// false when the tool does not hedge, or its percentile has too few
// samples yet. It also earns the call its share of hedges.
func (h *hedger) delay(def *registry.Tool) (time.Duration, bool) {
	if def.Policies.HedgeAfter == 0 && def.Policies.HedgePercentile == 0 {
		return 0, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.tokens = math.Min(h.tokens+h.ratio, hedgeMaxTokens)
	if def.Policies.HedgePercentile == 0 {
		return def.Policies.HedgeAfter, true
	}
	l := h.lat[def.Name]
	if l == nil || l.n < hedgeMinSamples {
		return 0, false
	}
	s := slices.Clone(l.d[:l.n])
	slices.Sort(s)
	return s[min(l.n-1, int(math.Ceil(def.Policies.HedgePercentile/100*float64(l.n)))-1)], true
}

// take spends a hedge token; false once hedges reached their ratio.
func (h *hedger) take() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.tokens < 1 {
		return false
	}
	h.tokens--
	return true
}

// observe records a successful attempt's latency, for a tool that hedges
// at a percentile of them (the others need none).
func (h *hedger) observe(def *registry.Tool, d time.Duration) {
	if def.Policies.HedgePercentile == 0 {
		return
	}
	name := def.Name
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lat == nil {
		h.lat = map[string]*latencies{}
	}
	l := h.lat[name]
	if l == nil {
		l = &latencies{}
		h.lat[name] = l
	}
	l.d[l.i] = d
	l.i = (l.i + 1) % hedgeWindow
	l.n = min(l.n+1, hedgeWindow)
}

// send makes one attempt of a call on route d: hedged when the tool
// hedges (a straggler is sent a second time), plainly otherwise. used is
// the number of attempt numbers it took.
func (e *Executor) send(ctx context.Context, d Dispatcher, def *registry.Tool, req tool.Request, res *CallResult) (reply tool.Outcome, used int) {
	start := time.Now()
	if after, ok := e.hedge.delay(def); ok {
		return e.hedged(ctx, d, def, req, res, start, after)
	}
	reply = d.Dispatch(ctx, req)
	if reply.Err == nil {
		e.hedge.observe(def, time.Since(start))
	}
	return reply, 1
}

// hedged sends one attempt of a tool that hedges; still unanswered after
// delay, it sends a copy as the next attempt, takes the first success (or
// the last failure) and cancels the other. It returns the reply and how
// many attempt numbers it used. It holds its goroutine until the reply.
func (e *Executor) hedged(ctx context.Context, d Dispatcher, def *registry.Tool, req tool.Request, res *CallResult, start time.Time, after time.Duration) (tool.Outcome, int) {
	type result struct {
		reply tool.Outcome
		hedge bool
	}
	out := make(chan result, 2)
	var wg sync.WaitGroup
	defer wg.Wait() // the loser has been cancelled: it returns at once
	send := func(req tool.Request, hedge bool) context.CancelCauseFunc {
		actx, cancel := context.WithCancelCause(ctx)
		wg.Go(func() { out <- result{d.Dispatch(actx, req), hedge} })
		return cancel
	}
	cancelPrimary := send(req, false)
	defer cancelPrimary(nil)
	timer := time.NewTimer(after)
	defer timer.Stop()
	select {
	case r := <-out:
		if r.reply.Err == nil {
			e.hedge.observe(def, time.Since(start))
		}
		return r.reply, 1
	case <-timer.C:
	}
	if !e.hedge.take() {
		r := <-out
		return r.reply, 1
	}
	hreq := req
	hreq.Attempt++
	cancelHedge := send(hreq, true)
	defer cancelHedge(nil)
	res.Hedged = true
	first := <-out
	if first.reply.Err != nil {
		first = <-out // a failed copy does not decide while the other may still succeed
	} else {
		e.hedge.observe(def, time.Since(start))
	}
	if first.hedge {
		cancelPrimary(errHedgeLost)
	} else {
		cancelHedge(errHedgeLost)
	}
	e.obs.Hedged(def.Name, first.hedge)
	return first.reply, 2
}
