package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/projectdavid/toolsidecar/config"
)

// SetSyncAlways is what an external NATS server's configuration needs so
// that JetStream syncs each write before acknowledging it.
const SetSyncAlways = "set `jetstream { sync_interval: always }` on each NATS server (docs/durable-mode.md)"

// syncAnswers bounds the servers SyncPolicy reads, and syncWait how long
// it waits for their answers.
const (
	syncAnswers = 64
	syncWait    = time.Second
)

// SyncPolicy says, for `toolsidecar check`, what can be learnt of the
// external NATS servers' JetStream sync policy, and whether it is a
// warning (a server that acknowledges writes before they are on disk).
// Only a client of the system account may read a server's configuration
// ($SYS.REQ.SERVER.PING.VARZ); any other is told that it cannot learn it,
// and what to set. It says nothing of the embedded server (whose sync is
// nats.embedded.sync) nor with durability off.
func SyncPolicy(ctx context.Context, cfg config.Config) (say string, warn bool, err error) {
	if cfg.NATS.URL == "" || !cfg.Durability.Enabled {
		return "", false, nil
	}
	nc, err := checkConnect(ctx, cfg.NATS)
	if err != nil {
		return "", false, err
	}
	defer nc.Close()
	always, periodic, err := askVarz(ctx, nc)
	if err != nil {
		return "", false, err
	}
	switch {
	case len(periodic) > 0:
		return fmt.Sprintf("NATS acknowledges JetStream writes before they are on disk on %s: a power failure or an OS crash loses them, "+
			"and an unsafe call whose ledger record is lost may run again; %s", strings.Join(periodic, ", "), SetSyncAlways), true, nil
	case len(always) > 0:
		return fmt.Sprintf("NATS syncs each JetStream write before acknowledging it on %s (sync_interval: always)", strings.Join(always, ", ")), false, nil
	}
	return "cannot learn the sync policy of an external server (only a system account user may read its configuration): " + SetSyncAlways, false, nil
}

// askVarz pings every server for its varz and sorts those with JetStream
// into the ones that sync every write and the others (name and interval).
// No answer (a client outside the system account) is two empty lists.
func askVarz(ctx context.Context, nc *nats.Conn) (always, periodic []string, err error) {
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, nil, fmt.Errorf("asking the NATS servers for their configuration: %w", err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest("$SYS.REQ.SERVER.PING.VARZ", inbox, nil); err != nil {
		return nil, nil, fmt.Errorf("asking the NATS servers for their configuration: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, syncWait)
	defer cancel()
	for range syncAnswers {
		m, err := sub.NextMsgWithContext(ctx)
		// No responders: the client is not the system account's, whose
		// subjects only its own clients reach.
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrNoResponders) {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("asking the NATS servers for their configuration: %w", err)
		}
		var r struct {
			Server server.ServerInfo `json:"server"`
			Data   struct {
				JetStream struct {
					Config *server.JetStreamConfig `json:"config"`
				} `json:"jetstream"`
			} `json:"data"`
		}
		if json.Unmarshal(m.Data, &r) != nil || r.Data.JetStream.Config == nil {
			continue // not a server with JetStream: it keeps no ledger
		}
		if c := r.Data.JetStream.Config; c.SyncAlways {
			always = append(always, r.Server.Name)
		} else {
			periodic = append(periodic, fmt.Sprintf("%s (every %s)", r.Server.Name, c.SyncInterval))
		}
	}
	slices.Sort(always)
	slices.Sort(periodic)
	return always, periodic, nil
}
