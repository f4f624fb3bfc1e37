package sidecar

import (
	"testing"

	"github.com/projectdavid/toolsidecar/config"
)

// TestEmbeddedSyncKey: the embedded server syncs each write unless the
// configuration says nats.embedded.sync: periodic; the default is always.
func TestEmbeddedSyncKey(t *testing.T) {
	for sync, periodic := range map[string]bool{config.Default().NATS.Embedded.Sync: false, config.SyncPeriodic: true} {
		n := config.Default().NATS
		n.Embedded.Sync = sync
		ecfg, err := embeddedConfig(n)
		if err != nil || ecfg.SyncPeriodic != periodic {
			t.Errorf("sync %q: SyncPeriodic %v (%v), want %v", sync, ecfg.SyncPeriodic, err, periodic)
		}
	}
}
