package bridge

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/internal/retry"
)

// ConnectConfig says how to reach NATS: the one place where connection
// options are built, for the sidecar and for `toolsidecar worker`.
type ConnectConfig struct {
	URL  string
	Name string
	// One kind of credential at most: a JWT credentials file, a user and
	// password, a token, or an nkey seed file. Secrets are values here;
	// the caller read them from their files.
	CredsFile    string
	User         string
	Password     string
	Token        string
	NKeySeedFile string
	CAFile       string
	CertFile     string
	KeyFile      string
	// OnReconnect, when set, is called after each reconnection, on NATS's
	// callback goroutine: it must not block.
	OnReconnect func()
	// FirstTry is how long the first connection is retried (with
	// backoff, each failure logged) before Connect gives up: a server
	// that starts a little after the sidecar, as in a rollout, is not a
	// crash. Zero: one attempt. Refused credentials end it at once.
	FirstTry time.Duration
	// OnRetry, when set, is told each failure of the first connection
	// that will be retried.
	OnRetry func(err error)
}

// Connect dials NATS, reconnecting forever once connected, and counts
// reconnections in toolsidecar_nats_reconnects_total on reg (nil: not
// counted). The first connection is retried for cfg.FirstTry, or until
// ctx ends. extra options are applied last.
func Connect(ctx context.Context, cfg ConnectConfig, reg prometheus.Registerer, log *slog.Logger, extra ...nats.Option) (*nats.Conn, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	opts := []nats.Option{
		nats.Name(cfg.Name), nats.MaxReconnects(-1), nats.ReconnectWait(500 * time.Millisecond),
		nats.DrainTimeout(10 * time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "err", err)
			}
		}),
		// Asynchronous errors (a reply refused because its requester is
		// gone, a slow consumer) go to the log, not to stderr unformatted.
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			log.Warn("nats async error", "subject", subject, "err", err)
		}),
	}
	var reconnects prometheus.Counter
	if reg != nil {
		reconnects = promauto.With(reg).NewCounter(prometheus.CounterOpts{Namespace: "toolsidecar", Subsystem: "nats", Name: "reconnects_total",
			Help: "Reconnections to NATS."})
	}
	opts = append(opts, nats.ReconnectHandler(func(nc *nats.Conn) {
		if reconnects != nil {
			reconnects.Inc()
		}
		log.Info("nats reconnected", "url", nc.ConnectedUrlRedacted())
		if cfg.OnReconnect != nil {
			cfg.OnReconnect()
		}
	}))
	switch {
	case cfg.CredsFile != "":
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	case cfg.User != "":
		opts = append(opts, nats.UserInfo(cfg.User, cfg.Password))
	case cfg.Token != "":
		opts = append(opts, nats.Token(cfg.Token))
	case cfg.NKeySeedFile != "":
		o, err := nats.NkeyOptionFromSeed(cfg.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("bridge: nkey seed: %w", err)
		}
		opts = append(opts, o)
	}
	if cfg.CAFile != "" {
		opts = append(opts, nats.RootCAs(cfg.CAFile))
	}
	if cfg.CertFile != "" || cfg.KeyFile != "" {
		opts = append(opts, nats.ClientCert(cfg.CertFile, cfg.KeyFile))
	}
	retry := []backoff.RetryOption{
		backoff.WithBackOff(retry.NATSConnect.New()),
		backoff.WithMaxElapsedTime(cfg.FirstTry),
		backoff.WithNotify(func(err error, wait time.Duration) {
			log.Warn("NATS unreachable; retrying", "url", config.RedactURL(cfg.URL), "err", err, "retry_in", wait)
			if cfg.OnRetry != nil {
				cfg.OnRetry(err)
			}
		}),
	}
	if cfg.FirstTry <= 0 {
		retry = append(retry, backoff.WithMaxTries(1))
	}
	nc, err := backoff.Retry(ctx, func() (*nats.Conn, error) {
		nc, err := nats.Connect(cfg.URL, append(opts, extra...)...)
		if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) {
			return nil, backoff.Permanent(err) // refused credentials do not improve with time
		}
		return nc, err
	}, retry...)
	if err != nil {
		return nil, fmt.Errorf("bridge: connecting to NATS at %s: %w", config.RedactURL(cfg.URL), err)
	}
	return nc, nil
}

// ErrClosedForGood: the NATS connection closed while its owner still
// served: the server refused the client (an error the client does not
// recover from), or reconnecting was given up.
var ErrClosedForGood = errors.New("the NATS connection closed for good")

// Lifeline watches a connection for a close its owner did not ask for,
// which must never be silent: the owner fails liveness and stops, so that
// the process exits non-zero and is started again. Pass [Lifeline.Option]
// to Connect.
type Lifeline struct {
	log      *slog.Logger
	stopping atomic.Bool
	lost     atomic.Pointer[error]
	closed   chan struct{}
}

// NewLifeline makes a Lifeline that logs to log.
func NewLifeline(log *slog.Logger) *Lifeline {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Lifeline{log: log, closed: make(chan struct{})}
}

// Option is the connection's ClosedHandler.
func (l *Lifeline) Option() nats.Option {
	return nats.ClosedHandler(func(nc *nats.Conn) {
		if !l.stopping.Load() {
			err := fmt.Errorf("%w: %v", ErrClosedForGood, cmp.Or(nc.LastError(), errors.New("closed without an error")))
			l.lost.Store(&err)
			l.log.Error("the NATS connection closed for good; stopping, so that the process is started again", "err", err)
		}
		close(l.closed)
	})
}

// Stopping says that the owner is stopping: a close from now on is its own.
func (l *Lifeline) Stopping() { l.stopping.Store(true) }

// Closed is closed once the connection has closed, for any reason.
func (l *Lifeline) Closed() <-chan struct{} { return l.closed }

// Err is why the connection closed while its owner served, or nil: the
// liveness probe's answer.
func (l *Lifeline) Err() error {
	if err := l.lost.Load(); err != nil {
		return *err
	}
	return nil
}
