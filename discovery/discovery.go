// Package discovery finds workers on the bus the way NATS micro services
// are found (ADR-32): the Go worker library is a micro service, and the
// other libraries answer $SRV.INFO like one, so one probe ([Probe]) finds
// every kind.
package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// InfoSubject is micro's discovery subject that every service answers.
const InfoSubject = "$SRV.INFO"

// DefaultWait is how long a probe collects answers by default.
const DefaultWait = 250 * time.Millisecond

// ServiceInfo is micro's INFO response, reduced to what liveness needs.
type ServiceInfo struct {
	Type      string            `json:"type"`
	Name      string            `json:"name"`
	ID        string            `json:"id"`
	Version   string            `json:"version"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	Endpoints []Endpoint        `json:"endpoints"`
}

// Endpoint is one endpoint of a [ServiceInfo].
type Endpoint struct {
	Name       string            `json:"name"`
	Subject    string            `json:"subject"`
	QueueGroup string            `json:"queue_group,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
}

// MaxServices bounds the answers one probe keeps: a bus that answers with
// more is not read further.
const MaxServices = 10000

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
		if len(out) == MaxServices {
			return out, nil
		}
	}
}
