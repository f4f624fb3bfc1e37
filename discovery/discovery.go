// Package discovery finds workers on the bus the way NATS micro services
// are found (ADR-32): a toolsidecar worker answers $SRV.PING and $SRV.INFO
// like a micro service ([Serve]), so one probe ([Probe]) finds both kinds.
package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
)

// micro's discovery subjects and response types.
const (
	PingSubject  = "$SRV.PING"
	InfoSubject  = "$SRV.INFO"
	infoRespType = "io.nats.micro.v1.info_response"
	pingRespType = "io.nats.micro.v1.ping_response"
)

// DefaultWait is how long a probe collects answers by default.
const DefaultWait = 250 * time.Millisecond

// ServiceInfo is micro's INFO response, reduced to what liveness needs.
type ServiceInfo struct {
	Type      string     `json:"type"`
	Name      string     `json:"name"`
	ID        string     `json:"id"`
	Version   string     `json:"version"`
	Endpoints []Endpoint `json:"endpoints"`
}

// Endpoint is one endpoint of a [ServiceInfo].
type Endpoint struct {
	Name       string `json:"name"`
	Subject    string `json:"subject"`
	QueueGroup string `json:"queue_group,omitempty"`
}

// Serve answers $SRV.PING and $SRV.INFO on nc for a service named name with
// the given endpoints. The caller unsubscribes the returned subscriptions.
func Serve(nc *nats.Conn, name string, endpoints []Endpoint) ([]*nats.Subscription, error) {
	info := ServiceInfo{Type: infoRespType, Name: name, ID: nuid.Next(), Version: "1.0.0", Endpoints: endpoints}
	infoJSON, err := json.Marshal(info)
	if err != nil {
		return nil, fmt.Errorf("discovery: %w", err)
	}
	pingJSON, err := json.Marshal(map[string]any{"type": pingRespType, "name": info.Name, "id": info.ID, "version": info.Version, "metadata": map[string]string{}})
	if err != nil {
		return nil, fmt.Errorf("discovery: %w", err)
	}
	var subs []*nats.Subscription
	for subject, reply := range map[string][]byte{InfoSubject: infoJSON, PingSubject: pingJSON} {
		sub, err := nc.Subscribe(subject, func(m *nats.Msg) { _ = m.Respond(reply) })
		if err != nil {
			for _, s := range subs {
				_ = s.Unsubscribe()
			}
			return nil, fmt.Errorf("discovery: subscribing %s: %w", subject, err)
		}
		subs = append(subs, sub)
	}
	return subs, nil
}

// Probe asks every service on the bus for its endpoints ($SRV.INFO) and
// returns the answers collected within wait. Undecodable answers are
// skipped.
func Probe(ctx context.Context, nc *nats.Conn, wait time.Duration) ([]ServiceInfo, error) {
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("discovery: probe: %w", err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(InfoSubject, inbox, nil); err != nil {
		return nil, fmt.Errorf("discovery: probe: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var out []ServiceInfo
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return out, nil // the wait is over
		}
		var info ServiceInfo
		if json.Unmarshal(m.Data, &info) == nil {
			out = append(out, info)
		}
	}
}
