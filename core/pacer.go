package core

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/projectdavid/toolsidecar/internal/clock"
)

// A Core, or the front before it, that refuses a request with 429 or 503
// is asked less often by every request of the client, whatever run sent
// it: Core's shipped nginx limits each client address (limit_req, 30
// requests a minute, burst 20, nodelay), and a sidecar is one address for
// all the runs of its pod. Hammering it only gets more requests refused,
// while the refused ones, retried, spend the submit budget.
//
// The pacer is the adaptive mode of the AWS SDKs' retries: a token bucket
// (golang.org/x/time/rate) that is not in the way until the first refusal,
// whose rate is then cut by beta on each refusal and raised, as requests
// succeed, along CUBIC's curve back to the rate of the last cut and,
// slowly, past it. Two changes suit a limit of a few requests a second,
// where the SDKs' constants are tuned for tens or hundreds:
//   - A refusal cuts the rate once per round: the refusals of requests
//     sent before the last cut, which the cut could not have spared, cut
//     no further (as TCP cuts its window once per window of losses).
//   - CUBIC's constant is small enough that the rate stays near the rate
//     of the last cut for some ten seconds at 30 requests a minute, where
//     the SDKs' constant overshoots it within two, and a limit that
//     allows one request every two seconds would refuse every other one.
//
// A Retry-After on a refusal holds every request until it has passed.
const (
	paceBeta = 0.7
	// paceCubic is CUBIC's constant, in requests per second per second
	// cubed: after a cut from 0.5 requests a second the rate is back to it
	// in cbrt(0.5*(1-beta)/c) = 10 s.
	paceCubic = 1.5e-4
	// paceFloor is the lowest rate the pacer sets, in requests per second:
	// a fifth of Core's shipped limit.
	paceFloor = 0.1
	// paceWindow is the window over which the rate of requests sent is
	// measured for the first cut.
	paceWindow = time.Second
	// refusalLogEvery spaces the WARNs that name the cause.
	refusalLogEvery = time.Minute
)

// pacer paces every request of one client. It is safe for concurrent use.
type pacer struct {
	now func() time.Time

	mu    sync.Mutex
	lim   *rate.Limiter
	paced bool      // a refusal set a rate; false: no request waits
	wmax  float64   // the rate cut from at the last cut
	cut   time.Time // the last cut
	until time.Time // no request leaves before (Retry-After)
	// window is when the current window of counted requests began;
	// inWindow counts them, before those of the window before it.
	window           time.Time
	inWindow, before int
	// refused counts the refusals by status (429, 503).
	refused map[int]int64

	log      *slog.Logger
	sometime rate.Sometimes
}

func newPacer(now func() time.Time) *pacer {
	return &pacer{now: now, lim: rate.NewLimiter(rate.Inf, 1), refused: map[int]int64{http.StatusTooManyRequests: 0, http.StatusServiceUnavailable: 0},
		sometime: rate.Sometimes{Interval: refusalLogEvery}}
}

// wait waits for the request's turn and returns the time it leaves, or
// fails when ctx ends or withdraw (nil: never) is closed first; a request
// that fails was never sent and holds no turn.
func (p *pacer) wait(ctx context.Context, withdraw <-chan struct{}) (time.Time, error) {
	for {
		now := p.now()
		res, d := p.reserve(now)
		if d <= 0 {
			return now, nil
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			p.cancel(res)
			return time.Time{}, fmt.Errorf("not sent, waiting for its turn while Core refuses requests: %w", context.Cause(ctx))
		case <-withdraw:
			t.Stop()
			p.cancel(res)
			return time.Time{}, ErrWithdrawn
		}
		if res != nil {
			now = p.now()
			p.mu.Lock()
			p.count(now)
			p.mu.Unlock()
			return now, nil
		}
		// A Retry-After held it: now it takes its turn.
	}
}

// reserve is the request's wait at now: while a Retry-After holds, the
// time left of it and no reservation (the request asks again then);
// otherwise its reservation of a token and the delay until it may leave.
// A request that may leave at once is counted as sent.
func (p *pacer) reserve(now time.Time) (*rate.Reservation, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if now.Before(p.until) {
		return nil, p.until.Sub(now)
	}
	var r *rate.Reservation
	if p.paced {
		r = p.lim.ReserveN(now, 1)
		if d := r.DelayFrom(now); d > 0 {
			return r, d
		}
	}
	p.count(now)
	return r, 0
}

// count counts a request sent at now, in windows of paceWindow.
func (p *pacer) count(now time.Time) {
	if now.Sub(p.window) >= paceWindow {
		p.before = 0
		if now.Sub(p.window) < 2*paceWindow {
			p.before = p.inWindow
		}
		p.window, p.inWindow = now, 0
	}
	p.inWindow++
}

// sentRate is the rate of the requests sent in the current window and
// the one before it.
func (p *pacer) sentRate(now time.Time) float64 {
	return float64(p.before+p.inWindow) / (now.Sub(p.window) + paceWindow).Seconds()
}

func (p *pacer) cancel(r *rate.Reservation) {
	if r != nil {
		r.CancelAt(p.now())
	}
}

// answered tells the pacer of the answer to a request sent at sent:
// status 0 for none (a transport error), which says nothing of Core's
// limit.
func (p *pacer) answered(sent time.Time, status int, retryAfter time.Duration) {
	switch {
	case status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable:
		p.refusal(sent, p.now(), status, retryAfter)
		p.sometime.Do(func() { p.warn(status) })
	case status != 0:
		p.success(p.now())
	}
}

// refusal cuts the rate, once per round, and holds every request for a
// Retry-After.
func (p *pacer) refusal(sent, now time.Time, status int, retryAfter time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refused[status]++
	if until := now.Add(retryAfter); retryAfter > 0 && until.After(p.until) {
		p.until = until
	}
	if p.paced && sent.Before(p.cut) {
		return // sent before the last cut: the same round
	}
	w := float64(p.lim.Limit())
	if !p.paced {
		w = p.sentRate(now)
	}
	w = max(w, paceFloor/paceBeta)
	p.wmax, p.cut, p.paced = w, now, true
	p.lim.SetLimitAt(now, rate.Limit(max(paceFloor, paceBeta*w)))
}

// success raises the rate along CUBIC's curve from the last cut:
// wmax + c(t-K)^3, K = cbrt(wmax(1-beta)/c), which is beta*wmax at the
// cut. Past twice wmax the pacer stands aside until the next refusal.
func (p *pacer) success(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.paced {
		return
	}
	k := math.Cbrt(p.wmax * (1 - paceBeta) / paceCubic)
	r := p.wmax + paceCubic*math.Pow(now.Sub(p.cut).Seconds()-k, 3)
	if r > 2*p.wmax {
		p.paced = false
		p.lim.SetLimitAt(now, rate.Inf)
		return
	}
	p.lim.SetLimitAt(now, rate.Limit(max(paceFloor, r)))
}

// rate is the paced rate in requests per second, 0 while requests are
// not paced.
func (p *pacer) rate() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.paced {
		return 0
	}
	return float64(p.lim.Limit())
}

// refusals is the count of refusals with status.
func (p *pacer) refusals(status int) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused[status]
}

// warn names the likely cause of the refusals for the operator.
func (p *pacer) warn(status int) {
	if p.log == nil {
		return
	}
	p.log.Warn(fmt.Sprintf("Core answers %d to this sidecar's address: a rate limit in front of Core, such as the limit_req of Core's shipped nginx; raise it for the sidecar", status),
		"paced_rate", p.rate(), "refused_429", p.refusals(http.StatusTooManyRequests), "refused_503", p.refusals(http.StatusServiceUnavailable))
}

// sendPaced sends req on hc's transport (send), paced.
func (c *Client) sendPaced(hc *http.Client, req *http.Request) (*http.Response, error) {
	return paced{c.pace, sendOn{hc}}.RoundTrip(req)
}

// sendOn is send on hc as a RoundTripper (a pointer in an interface: no
// allocation per request).
type sendOn struct{ hc *http.Client }

func (s sendOn) RoundTrip(r *http.Request) (*http.Response, error) { return send(s.hc, r) }

// paced is rt with every request paced by p: the client's own requests
// (sendPaced) and those it makes on others' behalf (Transport).
type paced struct {
	p  *pacer
	rt http.RoundTripper
}

// RoundTrip waits for the request's turn, sends it, and tells the pacer
// of the answer. A request that waits may be withdrawn (WithWithdraw).
func (t paced) RoundTrip(req *http.Request) (*http.Response, error) {
	withdraw, _ := req.Context().Value(withdrawKey{}).(<-chan struct{})
	sent, err := t.p.wait(req.Context(), withdraw)
	if err != nil {
		if req.Body != nil {
			req.Body.Close() // as a RoundTripper must
		}
		return nil, err
	}
	resp, err := t.rt.RoundTrip(req)
	if err != nil {
		t.p.answered(sent, 0, 0)
		return nil, err
	}
	t.p.answered(sent, resp.StatusCode, clock.RetryAfter(resp.Header.Get("Retry-After"), time.Now()))
	return resp, nil
}
