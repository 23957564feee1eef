package server

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

var serialMu sync.Mutex
var serial int64

func nextSerial() *big.Int {
	serialMu.Lock()
	defer serialMu.Unlock()
	serial++
	return big.NewInt(serial)
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          nextSerial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a leaf certificate and key in PEM signed by ca, for a
// server (on 127.0.0.1) or a client.
func (ca *testCA) issue(t *testing.T, name string, server bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: nextSerial(),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestListenTLSRequiresClientCertificate serves the daemon's handler (with
// the fake broker) on ListenTLS and dials it as clients with no
// certificate, with a certificate from another CA, and with the right one:
// only the last gets an answer, and the others never reach the handler.
func TestListenTLSRequiresClientCertificate(t *testing.T) {
	f := newFixture(t, nil, nil)
	dir := t.TempDir()
	serverCA := newTestCA(t, "sandboxd test server CA")
	clientCA := newTestCA(t, "sandboxd test client CA")
	otherCA := newTestCA(t, "another CA")

	srvCert, srvKey := serverCA.issue(t, "sandboxd", true)
	ln, err := ListenTLS("127.0.0.1:0",
		writeFile(t, dir, "server.crt", srvCert), writeFile(t, dir, "server.key", srvKey),
		writeFile(t, dir, "client-ca.crt", clientCA.pem))
	if err != nil {
		t.Fatal(err)
	}
	var reached atomic.Int64
	var handshakeErrs strings.Builder
	var logMu sync.Mutex
	hs := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			reached.Add(1)
			f.srv.Handler().ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: log.New(writerFunc(func(p []byte) (int, error) {
			logMu.Lock()
			defer logMu.Unlock()
			return handshakeErrs.Write(p)
		}), "", 0),
	}
	done := make(chan error, 1)
	go func() { done <- hs.Serve(ln) }()
	t.Cleanup(func() {
		hs.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve: got %v, want %v", err, http.ErrServerClosed)
		}
	})
	url := "https://" + ln.Addr().String() + "/healthz"

	roots := x509.NewCertPool()
	roots.AddCert(serverCA.cert)
	clientFor := func(t *testing.T, certPEM, keyPEM []byte) *http.Client {
		t.Helper()
		cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS13}
		if certPEM != nil {
			c, err := tls.X509KeyPair(certPEM, keyPEM)
			if err != nil {
				t.Fatal(err)
			}
			// Present the certificate whatever CAs the server asks for:
			// Go's default would withhold one the server does not name,
			// and a hostile client would not.
			cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &c, nil }
		}
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
	}

	goodCert, goodKey := clientCA.issue(t, "verifier", false)
	otherCert, otherKey := otherCA.issue(t, "verifier", false)
	// A server certificate's CA is not a client CA either.
	serverSigned, serverSignedKey := serverCA.issue(t, "verifier", false)
	refused := []struct {
		name      string
		cert, key []byte
		alert     string // the server's TLS alert as the client reports it
		serverLog string // the handshake error the server logs
	}{
		{"no client certificate", nil, nil, "certificate required", "didn't provide a certificate"},
		{"certificate from another CA", otherCert, otherKey, "unknown certificate authority", "unknown authority"},
		{"certificate from the server's CA", serverSigned, serverSignedKey, "unknown certificate authority", "unknown authority"},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			logMu.Lock()
			handshakeErrs.Reset()
			logMu.Unlock()
			before := reached.Load()
			resp, err := clientFor(t, tc.cert, tc.key).Get(url)
			if err == nil {
				resp.Body.Close()
				t.Fatalf("got HTTP %d, want the TLS handshake refused", resp.StatusCode)
			}
			if !strings.Contains(err.Error(), tc.alert) {
				t.Errorf("client error: got %v, want the alert %q", err, tc.alert)
			}
			if n := reached.Load() - before; n != 0 {
				t.Errorf("requests that reached the handler: got %d, want 0", n)
			}
			// The server logs the refused handshake shortly after.
			deadline := time.Now().Add(5 * time.Second)
			for {
				logMu.Lock()
				got := handshakeErrs.String()
				logMu.Unlock()
				if strings.Contains(got, "TLS handshake error") && strings.Contains(got, tc.serverLog) {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("server log: got %q, want a TLS handshake error mentioning %q", got, tc.serverLog)
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}

	t.Run("certificate from the client CA", func(t *testing.T) {
		before := reached.Load()
		resp, err := clientFor(t, goodCert, goodKey).Get(url)
		if err != nil {
			t.Fatalf("got %v, want an answer", err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET /healthz: got %d %s, want 200", resp.StatusCode, body)
		}
		if resp.TLS == nil || resp.TLS.Version != tls.VersionTLS13 {
			t.Errorf("connection: got %+v, want TLS 1.3", resp.TLS)
		}
		if n := reached.Load() - before; n != 1 {
			t.Errorf("requests that reached the handler: got %d, want 1", n)
		}
	})

	t.Run("below TLS 1.3", func(t *testing.T) {
		c := clientFor(t, goodCert, goodKey)
		c.Transport.(*http.Transport).TLSClientConfig.MinVersion = tls.VersionTLS12
		c.Transport.(*http.Transport).TLSClientConfig.MaxVersion = tls.VersionTLS12
		before := reached.Load()
		resp, err := c.Get(url)
		if err == nil {
			resp.Body.Close()
			t.Fatalf("got HTTP %d, want TLS 1.2 refused", resp.StatusCode)
		}
		if n := reached.Load() - before; n != 0 {
			t.Errorf("requests that reached the handler: got %d, want 0", n)
		}
	})
}

type writerFunc func([]byte) (int, error)

func (w writerFunc) Write(p []byte) (int, error) { return w(p) }

// TestListenTLSRefusesWithoutClientCA: TCP is mutual TLS or nothing.
func TestListenTLSRefusesWithoutClientCA(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "sandboxd test CA")
	cert, key := ca.issue(t, "sandboxd", true)
	certFile, keyFile := writeFile(t, dir, "server.crt", cert), writeFile(t, dir, "server.key", key)
	empty := writeFile(t, dir, "empty.pem", []byte("no certificates here\n"))
	for _, tc := range []struct {
		name                   string
		cert, key, ca, wantErr string
	}{
		{"no client CA", certFile, keyFile, "", "client CA are required"},
		{"no server key", certFile, "", filepath.Join(dir, "server.crt"), "are required"},
		{"client CA file without certificates", certFile, keyFile, empty, "no certificates in"},
		{"missing client CA file", certFile, keyFile, filepath.Join(dir, "absent.pem"), "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := ListenTLS("127.0.0.1:0", tc.cert, tc.key, tc.ca)
			if err == nil {
				ln.Close()
				t.Fatalf("got a listener, want an error containing %q", tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("got %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}
