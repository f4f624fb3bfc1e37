package agentsup

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/projectdavid/toolsidecar/agentsapi"
	"github.com/projectdavid/toolsidecar/tool"
)

// WebhookConfig configures the webhook receiver.
type WebhookConfig struct {
	Kind    string // agentsapi.KindOpenAI or agentsapi.KindAnthropic
	Watcher *Watcher
	// Secret is the signing secret, as the API gives it (whsec_<base64>).
	// Never logged.
	Secret string
	// Key is the sidecar's own API key: a session a webhook names is
	// followed with it. Never logged.
	Key    string
	Logger *slog.Logger
	// Metrics, when set, gets toolsidecar_webhooks_refused_total.
	Metrics prometheus.Registerer
	// Now is the clock the signature's timestamp is checked against.
	// default: time.Now
	Now func() time.Time
}

// Webhook receives the API's webhooks, signed per Standard Webhooks
// (webhook-id, webhook-timestamp, webhook-signature: an HMAC-SHA256 of
// "id.timestamp.body" under the secret): a session that requires action
// is read with the sidecar's own key, without a stream (Watcher.Poll),
// until its calls of the registry's tools have run and been answered. A request whose signature does
// not verify, or whose timestamp is more than webhookTolerance away, is
// refused (401) and changes nothing.
type Webhook struct {
	cfg     WebhookConfig
	key     []byte
	log     *slog.Logger
	refused *prometheus.CounterVec // by reason; nil: not counted
	// Anyone may post a webhook: the refused are logged once a period,
	// with how many came since the last line.
	refusedLog      rate.Sometimes
	refusedUnlogged atomic.Int64
}

// Why a webhook is refused: the reason label of
// toolsidecar_webhooks_refused_total.
const (
	refusedUnsigned  = "unsigned"  // a Standard Webhooks header is missing
	refusedTimestamp = "timestamp" // not Unix seconds, or past webhookTolerance
	refusedSignature = "signature" // no signature matches
)

// refusedLogEvery is how often, at most, refused webhooks are logged.
const refusedLogEvery = time.Minute

// webhookTolerance bounds how old (or early) a signed timestamp may be: a
// replayed webhook is refused past it.
const webhookTolerance = 5 * time.Minute

// NewWebhook builds the receiver. No I/O.
func NewWebhook(cfg WebhookConfig) (*Webhook, error) {
	if cfg.Kind != agentsapi.KindOpenAI && cfg.Kind != agentsapi.KindAnthropic {
		return nil, fmt.Errorf("agentsup: no webhooks for kind %q", cfg.Kind)
	}
	if cfg.Watcher == nil || cfg.Key == "" {
		return nil, errors.New("agentsup: webhooks need the watcher and the sidecar's own API key (upstream.api_key_file)")
	}
	raw := strings.TrimPrefix(strings.TrimSpace(cfg.Secret), "whsec_")
	key, err := base64.StdEncoding.DecodeString(raw)
	if err != nil || len(key) == 0 {
		return nil, errors.New("agentsup: the webhook secret is not whsec_ followed by base64")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &Webhook{cfg: cfg, key: key, log: log.With("component", cfg.Kind), refusedLog: rate.Sometimes{Interval: refusedLogEvery}}
	if cfg.Metrics != nil {
		h.refused = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "toolsidecar", Name: "webhooks_refused_total",
			Help: "Webhooks refused (401): by reason, unsigned, timestamp (malformed, or more than 5 minutes away) or signature."}, []string{"reason"})
		for _, r := range []string{refusedUnsigned, refusedTimestamp, refusedSignature} {
			h.refused.WithLabelValues(r)
		}
		cfg.Metrics.MustRegister(h.refused)
	}
	return h, nil
}

// Pattern is the route the receiver serves.
func (h *Webhook) Pattern() string { return "POST /v1/sidecar/webhooks/" + h.cfg.Kind }

func (h *Webhook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "reading the body: "+err.Error(), http.StatusRequestEntityTooLarge)
		return
	}
	if reason, err := h.verify(r.Header, body); err != nil {
		h.refuse(reason, err)
		http.Error(w, "the webhook's signature does not verify", http.StatusUnauthorized)
		return
	}
	id, ok := h.session(body)
	if !ok {
		w.WriteHeader(http.StatusNoContent) // another event: nothing to do
		return
	}
	if err := agentsapi.CheckSession(id); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if err := h.cfg.Watcher.Poll(id, h.cfg.Key, webhookOwner); err != nil {
		h.log.Warn("the session a webhook names is not watched", "session", tool.Excerpt(id), "err", err)
		http.Error(w, "not watched: "+err.Error(), http.StatusServiceUnavailable) // the API sends it again
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// webhookOwner is the caller of the sessions a webhook names: the
// sidecar's own key.
const webhookOwner = "toolsidecar-webhook"

// refuse counts a refused webhook, and logs it unless another was
// logged within refusedLogEvery.
func (h *Webhook) refuse(reason string, err error) {
	if h.refused != nil {
		h.refused.WithLabelValues(reason).Inc()
	}
	h.refusedUnlogged.Add(1)
	h.refusedLog.Do(func() {
		h.log.Warn("webhooks refused since the last such line (logged once a minute at most)", "count", h.refusedUnlogged.Swap(0), "last_err", err)
	})
}

// verify checks the Standard Webhooks signature and its timestamp; a
// webhook refused gets its reason.
func (h *Webhook) verify(hdr http.Header, body []byte) (reason string, _ error) {
	id, ts, sigs := hdr.Get("webhook-id"), hdr.Get("webhook-timestamp"), hdr.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return refusedUnsigned, errors.New("webhook-id, webhook-timestamp and webhook-signature are required")
	}
	secs, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return refusedTimestamp, fmt.Errorf("webhook-timestamp %s is not Unix seconds", tool.Excerpt(ts))
	}
	if d := h.cfg.Now().Sub(time.Unix(secs, 0)); d > webhookTolerance || d < -webhookTolerance {
		return refusedTimestamp, fmt.Errorf("webhook-timestamp is %v away from now, past %v", d.Round(time.Second), webhookTolerance)
	}
	mac := hmac.New(sha256.New, h.key)
	fmt.Fprintf(mac, "%s.%s.", id, ts)
	mac.Write(body)
	want := base64.StdEncoding.EncodeToString(mac.Sum(nil))
	for _, sig := range strings.Fields(sigs) {
		if v, ok := strings.CutPrefix(sig, "v1,"); ok && subtle.ConstantTimeCompare([]byte(v), []byte(want)) == 1 {
			return "", nil
		}
	}
	return refusedSignature, errors.New("no signature matches")
}

// session is the id of the session an event says requires action:
// OpenAI's agent.session.action_required ({"type", "data": {"id"}}),
// Anthropic's session.requires_action in a "type":"event" envelope.
func (h *Webhook) session(body []byte) (string, bool) {
	var ev struct {
		Type string `json:"type"`
		Data struct {
			Type string `json:"type"`
			ID   string `json:"id"`
		} `json:"data"`
	}
	if json.Unmarshal(body, &ev) != nil {
		return "", false
	}
	switch {
	case h.cfg.Kind == agentsapi.KindOpenAI && ev.Type == "agent.session.action_required":
	case h.cfg.Kind == agentsapi.KindAnthropic && ev.Type == "event" && ev.Data.Type == "session.requires_action":
	default:
		return "", false
	}
	return ev.Data.ID, ev.Data.ID != ""
}
