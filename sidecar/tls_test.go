package sidecar_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/projectdavid/toolsidecar/config"
	"github.com/projectdavid/toolsidecar/internal/testenv"
)

// testPKI writes a CA, a server certificate for 127.0.0.1 and a client
// certificate, all signed by the CA, as PEM files.
type testPKI struct {
	dir                                                  string
	caFile, serverCert, serverKey, clientCert, clientKey string
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
