package sidecar_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/core"
	"github.com/projectdavid/toolsidecar/embedded"
	"github.com/projectdavid/toolsidecar/executor"
	"github.com/projectdavid/toolsidecar/sidecar"
	"github.com/projectdavid/toolsidecar/sim/coresim"
	"github.com/projectdavid/toolsidecar/testkit/natstest"
	"github.com/projectdavid/toolsidecar/testkit/testenv"
	"github.com/projectdavid/toolsidecar/tool"
)

// testPKI writes a CA, a server certificate for 127.0.0.1 and a client
// certificate, all signed by the CA, as PEM files.
type testPKI struct {
	dir                                                  string
	caFile, serverCert, serverKey, clientCert, clientKey string
	// appCert and appKey are a second client's: the application's.
	appCert, appKey string
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	p := testPKI{dir: dir, caFile: filepath.Join(dir, "ca.pem")}
	writePEM(t, p.caFile, "CERTIFICATE", caDER)
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage) (string, string) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, _ := x509.MarshalECPrivateKey(key)
		cert, keyFile := filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
		writePEM(t, cert, "CERTIFICATE", der)
		writePEM(t, keyFile, "EC PRIVATE KEY", keyDER)
		return cert, keyFile
	}
	p.serverCert, p.serverKey = leaf("server", 2, x509.ExtKeyUsageServerAuth)
	p.clientCert, p.clientKey = leaf("client", 3, x509.ExtKeyUsageClientAuth)
	p.appCert, p.appKey = leaf("app", 4, x509.ExtKeyUsageClientAuth)
	return p
}

func writePEM(t *testing.T, file, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestEmbeddedTLS: with nats.embedded.tls and a client CA, a worker needs
// both a client certificate and its password; the sidecar itself, in
// process, needs neither a socket nor a certificate.
func TestEmbeddedTLS(t *testing.T) {
	pki := newTestPKI(t)
	env := testenv.Start(t, oneCall("echo"), testenv.Options{NATS: func(n *config.NATS) {
		n.Embedded.TLS = config.TLS{CertFile: pki.serverCert, KeyFile: pki.serverKey, CAFile: pki.caFile}
	}}, testenv.Tool{Config: config.Tool{Name: "echo"}})
	roots, _ := os.ReadFile(pki.caFile)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(roots)
	cert, err := tls.LoadX509KeyPair(pki.clientCert, pki.clientKey)
	if err != nil {
		t.Fatal(err)
	}
	login := nats.UserInfo(testenv.WorkerUser, env.WorkerPassword)
	nc, err := nats.Connect(env.NATSURL, login, nats.Secure(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}))
	if err != nil {
		t.Fatalf("a worker with a client certificate: %v", err)
	}
	nc.Close()
	if nc, err := nats.Connect(env.NATSURL, login, nats.NoReconnect(), nats.Secure(&tls.Config{RootCAs: pool})); err == nil {
		nc.Close()
		t.Error("a worker without a client certificate connected")
	}
	if nc, err := nats.Connect(strings.Replace(env.NATSURL, "tls://", "nats://", 1), login, nats.NoReconnect()); err == nil {
		nc.Close()
		t.Error("a worker without TLS connected")
	}
}

// tlsConfig trusts the PKI's CA and presents the given certificate, if any.
func (p testPKI) tlsConfig(t *testing.T, certFile, keyFile string) *tls.Config {
	t.Helper()
	roots, err := os.ReadFile(p.caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(roots)
	tc := &tls.Config{RootCAs: pool, ClientCAs: pool, MinVersion: tls.VersionTLS12}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc
}

// TestCoreOverTLS: Core behind TLS with a private CA, asking for a client
// certificate (core.tls). The sidecar's requests of several runs at once
// reach Core over at most core.max_connections connections for its short
// calls, kept between requests (a new connection, with its handshake, for
// each of the three writes of every call would cost Core more than the
// writes), plus one per turn's stream. The readiness probe and the proxy
// use the same TLS.
func TestCoreOverTLS(t *testing.T) {
	pki := newTestPKI(t)
	const maxConns, runs, calls = 4, 4, 6
	var sidecarConns, appConns atomic.Int64
	names := make([]string, calls)
	for i := range names {
		names[i] = "echo"
	}
	env := testenv.Start(t, batchOf(names...), testenv.Options{
		ServeCore: func(sim *coresim.Sim) (string, *core.Client, func()) {
			srv := httptest.NewUnstartedServer(sim)
			srv.TLS = pki.tlsConfig(t, pki.serverCert, pki.serverKey)
			srv.TLS.ClientAuth = tls.RequireAndVerifyClientCert
			// Run on every connection, resumed or not: who opened it.
			srv.TLS.VerifyConnection = func(cs tls.ConnectionState) error {
				if len(cs.PeerCertificates) > 0 && cs.PeerCertificates[0].Subject.CommonName == "client" {
					sidecarConns.Add(1)
				} else {
					appConns.Add(1)
				}
				return nil
			}
			srv.StartTLS()
			app, err := core.New(core.Config{URL: srv.URL, APIKey: testenv.APIKey}, core.WithTLS(pki.tlsConfig(t, pki.appCert, pki.appKey)))
			if err != nil {
				t.Fatal(err)
			}
			return srv.URL, app, srv.Close
		},
		Config: func(c *config.Config) {
			c.Core.TLS = config.TLS{CAFile: pki.caFile, CertFile: pki.clientCert, KeyFile: pki.clientKey}
			c.Core.MaxConnections = maxConns
			c.Core.ReadinessCheck = true
		},
	}, testenv.Tool{Config: config.Tool{Name: "echo"}, Handler: testenv.Echo})

	rs := make([]testenv.Run, runs)
	for i := range rs {
		rs[i] = env.NewRun()
	}
	sums := make([]executor.Summary, runs)
	var wg sync.WaitGroup
	for i, r := range rs {
		wg.Go(func() { _, sums[i] = testenv.Drive(t, env.URL, r, nil) })
	}
	wg.Wait()
	for i, r := range rs {
		if sums[i].Status != executor.StatusCompleted {
			t.Fatalf("run %d: %s (%s)", i, sums[i].Status, sums[i].Error)
		}
		env.AssertWholeBatches(r, calls)
	}
	writes := env.Sim.CountRequests(http.MethodPut, "/v1/actions/") + env.Sim.CountRequests(http.MethodPost, "/v1/messages/tools")
	if writes < runs*calls*2 {
		t.Fatalf("Core saw %d writes, want at least %d", writes, runs*calls*2)
	}
	// Short calls: at most maxConns at once, kept. Streams: at most one
	// for each turn (two per run), kept once Core ends them. And the
	// readiness probe's own, made
	// while the test waited for the workers (/readyz asks Core here).
	if n, most := sidecarConns.Load(), int64(maxConns+2*runs+1); n < 1 || n > most {
		t.Errorf("the sidecar opened %d TLS connections to Core for %d writes and %d runs, want 1 to %d", n, writes, runs, most)
	}
	// The readiness probe and proxy mode (on by default) reach the same
	// Core with the same TLS, on connections of their own, kept.
	before := sidecarConns.Load()
	resp, err := http.Get(env.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/readyz with core.readiness_check: HTTP %d %s", resp.StatusCode, body)
	}
	for i, r := range rs {
		req, _ := http.NewRequest(http.MethodGet, env.URL+"/v1/runs/"+r.RunID, nil)
		req.Header.Set("X-API-Key", testenv.APIKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var run core.Run
		err = json.NewDecoder(resp.Body).Decode(&run)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || err != nil || run.ID != r.RunID {
			t.Fatalf("run %d through the proxy: HTTP %d, %+v, %v", i, resp.StatusCode, run, err)
		}
	}
	if n := sidecarConns.Load() - before; n > 2 {
		t.Errorf("the probe and %d proxied reads, one after the other, opened %d TLS connections to Core, want at most 2 (the probe's own may overlap)", runs, n)
	}
	if n, _ := metric(t, env.Sidecar, "toolsidecar_core_connections_opened_total"); n != float64(sidecarConns.Load()) {
		t.Errorf("toolsidecar_core_connections_opened_total is %v; Core accepted %d connections from the sidecar", n, sidecarConns.Load())
	}
	t.Logf("%d TLS connections from the sidecar (%d from the application) for %d writes", sidecarConns.Load(), appConns.Load(), writes)
}

// TestExternalNATSOverMutualTLS: the sidecar reaches an external NATS
// that asks for a client certificate (nats.url tls://, nats.tls), and a
// worker with its own certificate serves the run's calls over it. Without
// the client certificate the sidecar does not start, and says why.
func TestExternalNATSOverMutualTLS(t *testing.T) {
	pki := newTestPKI(t)
	stc := pki.tlsConfig(t, pki.serverCert, pki.serverKey)
	stc.ClientAuth = tls.RequireAndVerifyClientCert
	ns, err := embedded.Start(embedded.Config{Listen: "127.0.0.1:-1", AllowAnonymous: true, TLS: stc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	url := ns.ClientURL()

	wc, err := nats.Connect(url, nats.Secure(pki.tlsConfig(t, pki.appCert, pki.appKey)))
	if err != nil {
		t.Fatalf("the worker's connection: %v", err)
	}
	defer wc.Close()
	natstest.WorkerOn(t, wc, testenv.Prefix, map[string]tool.Handler{"echo": testenv.Echo})

	external := func(withCert bool) func(*config.NATS) {
		return func(n *config.NATS) {
			n.URL = url
			n.TLS = config.TLS{CAFile: pki.caFile}
			if withCert {
				n.TLS.CertFile, n.TLS.KeyFile = pki.clientCert, pki.clientKey
			}
		}
	}
	env := testenv.Start(t, batchOf("echo", "echo"), testenv.Options{NATS: external(true),
		Config: func(c *config.Config) { c.Durability.Enabled = false }}, testenv.Tool{Config: config.Tool{Name: "echo"}})
	r := env.NewRun()
	if _, sum := testenv.Drive(t, env.URL, r, nil); sum.Status != executor.StatusCompleted {
		t.Fatalf("drive over mutual TLS: %s (%s)", sum.Status, sum.Error)
	}
	env.AssertWholeBatches(r, 2)

	cfg, _ := testenv.Config(t, env.SimURL, testenv.Options{NATS: external(false)}, nil)
	cfg.Durability.Enabled = false
	cfg.NATS.ConnectRetry = 0
	s, err := sidecar.Start(context.Background(), cfg, sidecar.WithAPIKey(testenv.APIKey))
	if err == nil {
		s.Shutdown(context.Background())
		t.Fatal("the sidecar started without the client certificate the server asks for")
	}
	if !strings.Contains(err.Error(), "NATS") {
		t.Errorf("error %q does not say NATS refused", err)
	}
	t.Logf("without a client certificate: %v", err)
}
