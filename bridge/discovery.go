package bridge

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
)

// NATS micro's discovery subjects and response types (ADR-32). A toolsidecar
// worker answers them like a micro service, so one probe finds both kinds.
const (
	pingSubject  = "$SRV.PING"
	infoSubject  = "$SRV.INFO"
	infoRespType = "io.nats.micro.v1.info_response"
	pingRespType = "io.nats.micro.v1.ping_response"
)

// ServiceInfo is micro's INFO response, reduced to what liveness needs.
type ServiceInfo struct {
	Type      string         `json:"type"`
	Name      string         `json:"name"`
	ID        string         `json:"id"`
	Version   string         `json:"version"`
	Endpoints []EndpointInfo `json:"endpoints"`
}

// EndpointInfo is one endpoint of a [ServiceInfo].
type EndpointInfo struct {
	Name       string `json:"name"`
	Subject    string `json:"subject"`
	QueueGroup string `json:"queue_group,omitempty"`
}

// serveDiscovery makes the worker answer $SRV.PING and $SRV.INFO.
func (w *Worker) serveDiscovery() error {
	info := ServiceInfo{Type: infoRespType, Name: "toolsidecar-worker", ID: nuid.Next(), Version: "1.0.0"}
	for tool := range w.handlers {
		info.Endpoints = append(info.Endpoints, EndpointInfo{Name: tool, Subject: w.prefix + "." + tool, QueueGroup: w.queue})
	}
	infoJSON, _ := json.Marshal(info)
	pingJSON, _ := json.Marshal(map[string]any{"type": pingRespType, "name": info.Name, "id": info.ID, "version": info.Version, "metadata": map[string]string{}})
	for subject, reply := range map[string][]byte{infoSubject: infoJSON, pingSubject: pingJSON} {
		sub, err := w.nc.Subscribe(subject, func(m *nats.Msg) { _ = m.Respond(reply) })
		if err != nil {
			return fmt.Errorf("bridge: subscribing %s: %w", subject, err)
		}
		w.subs = append(w.subs, sub)
	}
	return nil
}

// Live asks every service on the bus for its endpoints ($SRV.INFO) and
// reports which tools under the client's prefix have at least one live
// worker. It collects answers for wait.
func (c *Client) Live(ctx context.Context, wait time.Duration) (map[string]bool, error) {
	inbox := c.nc.NewInbox()
	sub, err := c.nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("bridge: liveness probe: %w", err)
	}
	defer sub.Unsubscribe()
	if err := c.nc.PublishRequest(infoSubject, inbox, nil); err != nil {
		return nil, fmt.Errorf("bridge: liveness probe: %w", err)
	}
	live := map[string]bool{}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return live, nil // the wait is over
		}
		var info ServiceInfo
		if json.Unmarshal(m.Data, &info) != nil {
			continue
		}
		for _, ep := range info.Endpoints {
			if tool, ok := strings.CutPrefix(ep.Subject, c.prefix+"."); ok && !strings.ContainsAny(tool, ".*>") {
				live[tool] = true
			}
		}
	}
}

// discoveryTimeout is how long Live waits for INFO answers by default.
const discoveryTimeout = 250 * time.Millisecond

// LiveDefault is Live with the default wait.
func (c *Client) LiveDefault(ctx context.Context) (map[string]bool, error) {
	return c.Live(ctx, discoveryTimeout)
}
