package ledger

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/projectdavid/toolsidecar/tool"
)

// Workers may publish to the reply namespace outside the replies of their
// own requests (a reply buffered through a NATS restart still lands; the
// server forgot, across its restart, which requests the worker received).
// So a worker credential could fill the stream with replies to calls that
// do not exist. Two bounds: the stream keeps one message per subject,
// within max_bytes and the message size; and every reply token is sealed
// with a key only sidecars read (Seal), so that the sweeper deletes each
// message whose token no sidecar made as it arrives, and a forged reply is
// never kept beyond that.

// replyKeyName is where the sealing key is kept, in the ledger's bucket:
// not a possible Action id (tool.CheckID refuses '.'), so no call's entry
// may overwrite it.
const replyKeyName = "toolsidecar.reply-key"

// replyKeyRenew is how often a sidecar writes the key again, so that it
// does not expire with the bucket's entries while any sidecar lives.
const replyKeyRenew = time.Hour

// Sizes of a reply token (bridge.TokenNonce and bridge.TokenBytes).
const (
	tokenNonce = 12
	tokenBytes = 20
)

// replyKey reads the sealing key of the ledger's sidecars, or makes it.
func replyKey(ctx context.Context, kv jetstream.KeyValue) ([]byte, error) {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	_, err := kv.Create(ctx, replyKeyName, key)
	if errors.Is(err, jetstream.ErrKeyExists) {
		e, gerr := kv.Get(ctx, replyKeyName)
		if gerr != nil {
			return nil, gerr
		}
		return e.Value(), nil
	}
	return key, err
}

// Seal writes into token[tokenNonce:] the truncated HMAC of its nonce.
func (l *Ledger) Seal(token []byte) {
	m := l.macs.Get().(*mac)
	m.h.Reset()
	m.h.Write(token[:tokenNonce])
	m.sum = m.h.Sum(m.sum[:0])
	copy(token[tokenNonce:tokenBytes], m.sum)
	l.macs.Put(m)
}

type mac struct {
	h   hash.Hash
	sum []byte
}

func (l *Ledger) newMACs() {
	l.macs = sync.Pool{New: func() any { return &mac{h: hmac.New(sha256.New, l.key)} }}
}

// genuine reports whether a subject of the reply namespace is one a
// sidecar of this ledger made: <prefix>.replies.<instance>.<sealed token>.
func (l *Ledger) genuine(subject string) bool {
	rest, ok := strings.CutPrefix(subject, l.cfg.Prefix+".replies.")
	if !ok {
		return false
	}
	i := strings.LastIndexByte(rest, '.')
	if i <= 0 || strings.IndexByte(rest[:i], '.') >= 0 { // one instance token, one reply token
		return false
	}
	var tok [tokenBytes + 2]byte
	n, err := base64.RawURLEncoding.Decode(tok[:], []byte(rest[i+1:]))
	if err != nil || n != tokenBytes {
		return false
	}
	want := [tokenBytes]byte(tok[:tokenBytes])
	l.Seal(want[:])
	return hmac.Equal(want[tokenNonce:], tok[tokenNonce:tokenBytes])
}

// sweep deletes, as they arrive, the messages of the reply stream whose
// subject no sidecar made: from the stream's start, so that those that
// came while no sidecar swept go too. It returns once the sweeper runs;
// stop it with the returned context's Stop.
func (l *Ledger) sweep(ctx context.Context, refused prometheus.Counter) (jetstream.ConsumeContext, error) {
	cons, err := l.replies.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{HeadersOnly: true})
	if err != nil {
		return nil, fmt.Errorf("ledger: reply sweeper: %w", err)
	}
	var lastLog time.Time // the callback runs on one goroutine at a time
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if l.genuine(m.Subject()) {
			return
		}
		meta, err := m.Metadata()
		if err != nil {
			return
		}
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = l.replies.DeleteMsg(dctx, meta.Sequence.Stream)
		cancel()
		refused.Inc()
		if time.Since(lastLog) > 10*time.Second { // a flood is one line per ten seconds
			lastLog = time.Now()
			l.log.Warn("a reply to no call of any sidecar was deleted: a worker publishes outside its calls' replies",
				"subject", tool.Excerpt(m.Subject()), "err", err)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: reply sweeper: %w", err)
	}
	return cc, nil
}

// renewKey writes the sealing key again every replyKeyRenew until ctx
// ends, so that it does not expire with the bucket's entries.
func (l *Ledger) renewKey(ctx context.Context) {
	t := time.NewTicker(replyKeyRenew)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if _, err := l.kv.Put(rctx, replyKeyName, l.key); err != nil {
				l.log.Warn("renewing the reply key", "err", err)
			}
			cancel()
		}
	}
}

// registerRefused is the sweeper's counter on reg (nil: not exported).
func registerRefused(reg prometheus.Registerer) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Namespace: "toolsidecar", Subsystem: "ledger", Name: "replies_refused_total",
		Help: "Messages of the reply stream deleted because no sidecar made their subject: a worker published outside its calls' replies."})
	if reg != nil {
		reg.MustRegister(c)
	}
	return c
}
