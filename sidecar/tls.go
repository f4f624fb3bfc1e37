package sidecar

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"github.com/projectdavid/toolsidecar/config"
)

// serverTLS is the TLS of a listener: its certificate, and, with a CA
// file, client certificates required and verified against it.
func serverTLS(t config.TLS) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, err
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if t.CAFile != "" {
		if tc.ClientCAs, err = certPool(t.CAFile); err != nil {
			return nil, err
		}
		tc.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return tc, nil
}

// coreTLS is the TLS configuration for Core when core.tls is set: a
// private CA bundle and an optional client certificate. nil otherwise. The
// Core client applies it to its own transports, which keep their pooling.
func coreTLS(t config.TLS) (*tls.Config, error) {
	if t == (config.TLS{}) {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	var err error
	if t.CAFile != "" {
		if tc.RootCAs, err = certPool(t.CAFile); err != nil {
			return nil, fmt.Errorf("core.tls.ca_file: %w", err)
		}
	}
	if t.CertFile != "" || t.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("core.tls: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

func certPool(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New(file + " holds no PEM certificate")
	}
	return pool, nil
}
