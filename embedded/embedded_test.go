package embedded

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSyncBeforeAck: a server with JetStream syncs each write to disk
// before it acknowledges it, unless the configuration opts out by name.
// The ledger's record of an unsafe call is such a write: lost in a power
// failure, the call would run again.
func TestSyncBeforeAck(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  Config
		want bool
	}{
		{"default", Config{Listen: "127.0.0.1:-1", StoreDir: t.TempDir()}, true},
		{"opted out", Config{Listen: "127.0.0.1:-1", StoreDir: t.TempDir(), SyncPeriodic: true}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := Start(c.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Shutdown()
			js := s.ns.JetStreamConfig()
			if js == nil {
				t.Fatal("JetStream is off")
			}
			if js.SyncAlways != c.want {
				t.Fatalf("SyncAlways = %v (sync interval %s), want %v", js.SyncAlways, js.SyncInterval, c.want)
			}
		})
	}
}
