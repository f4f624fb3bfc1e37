package bridge

import (
	"context"
	"strings"
	"time"

	"github.com/projectdavid/toolsidecar/discovery"
)

// Live asks every service on the bus for its endpoints ($SRV.INFO) and
// reports which tools under the client's prefix have at least one live
// worker. It collects answers for wait (<= 0: discovery.DefaultWait).
func (c *Client) Live(ctx context.Context, wait time.Duration) (map[string]bool, error) {
	if wait <= 0 {
		wait = discovery.DefaultWait
	}
	infos, err := discovery.Probe(ctx, c.nc, wait)
	if err != nil {
		return nil, err
	}
	live := map[string]bool{}
	for _, info := range infos {
		for _, ep := range info.Endpoints {
			if name, ok := strings.CutPrefix(ep.Subject, c.prefix+"."); ok && !strings.ContainsAny(name, ".*>") {
				live[name] = true
			}
		}
	}
	return live, nil
}
