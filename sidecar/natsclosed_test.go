package sidecar_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/projectdavid/toolsidecar/bridge"
	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/sidecar"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/poll"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
)

// TestNATSClosedForGood: the NATS server comes back after a restart with
// the sidecar's token revoked, so the client gives up reconnecting. The
// sidecar does not go on silently, ready but unable to dispatch: /healthz
// answers 503 with the cause (so Kubernetes restarts the pod), the log
// says why, and Run returns the error (so the process exits non-zero)
// once its drives are left for the next.
// Before, the connection stayed closed while /healthz answered 200.
func TestNATSClosedForGood(t *testing.T) {
	addr := testenv.FreeAddr(t)
	host, port := splitAddr(t, addr)
	start := func(token string) *server.Server {
		ns, err := server.NewServer(&server.Options{Host: host, Port: port, Authorization: token, NoLog: true, NoSigs: true})
		if err != nil {
			t.Fatal(err)
		}
		go ns.Start()
		if !ns.ReadyForConnections(5 * time.Second) {
			t.Fatal("NATS did not start")
		}
		return ns
	}
	ns := start("token-one")
	t.Cleanup(func() { ns.Shutdown() })
	_, srv := coresim.NewServer(coresim.Config{APIKey: testenv.APIKey, Scenario: oneCall("echo")})
	defer srv.Close()
	cfg, _ := testenv.Config(t, srv.URL, testenv.Options{}, []testenv.Tool{{Config: config.Tool{Name: "echo"}}})
	cfg.NATS.URL = "nats://" + addr
	cfg.NATS.TokenFile = filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(cfg.NATS.TokenFile, []byte("token-one"), 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &testenv.LogBuffer{}
	s, err := sidecar.Start(context.Background(), cfg, sidecar.WithAPIKey(testenv.APIKey), sidecar.WithLogger(slog.New(slog.NewJSONHandler(logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- s.Run(context.Background()) }()
	base := "http://" + s.Addr()
	if code, _ := probe(t, base+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz %d before the fault", code)
	}

	ns.Shutdown()
	ns = start("token-two") // the sidecar's token is no longer accepted

	// The sidecar fails liveness, then stops: either answer is the end
	// of a sidecar that can no longer dispatch (server.TestLiveness has
	// the 503 itself).
	select {
	case err := <-ran:
		if !errors.Is(err, bridge.ErrClosedForGood) {
			t.Errorf("Run returned %v, want bridge.ErrClosedForGood", err)
		}
	case <-time.After(poll.Timeout):
		t.Fatalf("Run did not return after NATS closed for good\n%s", logs)
	}
	if code, body := probe(t, base+"/healthz"); code == http.StatusOK {
		t.Errorf("/healthz answers %d %s after NATS closed for good", code, body)
	}
	if !strings.Contains(logs.String(), "the NATS connection closed for good") {
		t.Errorf("the cause is not in the log:\n%s", logs)
	}
}

// probe fetches url, or returns 0 when nothing answers.
func probe(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func splitAddr(t *testing.T, addr string) (string, int) {
	t.Helper()
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return host, port
}
