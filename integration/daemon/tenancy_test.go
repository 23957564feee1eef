package daemon

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
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moby/moby/api/types/events"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/testharness"
	"github.com/sandboxd/sandboxd/sandbox"
	sbclient "github.com/sandboxd/sandboxd/sandbox/client"
)

// A job asking more CPUs than this host has is refused at admission: 400
// invalid, naming the limit, the value asked and the host's most; nothing
// is journaled and no container of the daemon's name is created (the
// engine had refused it only at create, after a signed receipt, and the
// job ended error).
func TestJobBeyondTheHostIsRefusedAtAdmission(t *testing.T) {
	d := newDaemon(t)
	var creates []string
	stopEvents := d.followEvents(make(client.Filters).Add("type", "container").Add("event", "create").Add("label", broker.LabelBroker+"="+d.name),
		func(m events.Message) {
			creates = append(creates, m.Actor.Attributes["name"]+" (job "+m.Actor.Attributes[broker.LabelJob]+")")
		})
	d.start()
	ctx := ctxFor(t, 2*time.Minute)
	info, err := env.Eng.Info(ctx, client.InfoOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ncpu := info.Info.NCPU
	job := env.NewJob(t, testharness.Sh("echo must never run"), func(j *sandbox.Job) { j.Limits.CPUMillis = 256_000 })
	_, err = d.client.Submit(ctx, job)
	var ae *sbclient.APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusBadRequest || ae.Code != "invalid" || ae.Field != "job.limits.cpu_millis" || !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("submit of a 256-CPU job on a %d-CPU host: got %v, want 400 invalid on job.limits.cpu_millis", ncpu, err)
	}
	for _, want := range []string{"256000 (256 CPUs)", fmt.Sprintf("at most %d (%d CPUs", ncpu*1000, ncpu)} {
		if !strings.Contains(ae.Message, want) {
			t.Errorf("refusal %q does not say %q", ae.Message, want)
		}
	}
	resp, err := d.http().Get("http://sandboxd/v1/jobs/" + job.ID)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("the refused job: GET answered %d, want 404 (nothing journaled)", resp.StatusCode)
	}
	// The same host's most is accepted, and runs.
	fits := env.NewJob(t, testharness.Sh("echo fits"), func(j *sandbox.Job) { j.Limits.CPUMillis = int64(ncpu) * 1000 })
	if _, err := d.client.Submit(ctx, fits); err != nil {
		t.Fatalf("submit of a job asking the host's %d CPUs: %v", ncpu, err)
	}
	if sr, err := d.client.Wait(ctx, fits); err != nil || sr.Result.Status != sandbox.StatusSucceeded {
		t.Fatalf("the job asking the host's CPUs: %v %+v, want succeeded", err, sr.Result)
	}
	d.stop()
	stopEvents()
	for _, c := range creates {
		if strings.Contains(c, job.ID) {
			t.Errorf("a container was created for the refused job: %s", c)
		}
	}
}

// Two daemons of one --name on one engine (two state directories): the
// second refuses to start, naming the first (it would reap the first's
// sandboxes); once the first is SIGKILLed, a daemon of the name starts
// again at once, and a clean stop leaves no mark of the name.
func TestSecondDaemonOfANameRefusesToStart(t *testing.T) {
	first := newDaemon(t)
	first.start()
	second := newDaemon(t)
	second.name = first.name

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, "serve", "--socket", second.socket, "--state", second.state, "--key", keyPath, "--name", second.name)
	cmd.Env = append(os.Environ(), "SANDBOXD_SHIM="+env.Shim, "SANDBOXD_PROBE="+env.Probe, "SANDBOXD_KEY_PASSWORD=")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err == nil || cmd.ProcessState.ExitCode() != 4 {
		t.Errorf("second daemon: got %v after %v, want exit code 4", err, time.Since(start).Round(time.Millisecond))
	}
	for _, want := range []string{fmt.Sprintf("pid %d", first.cmd.Process.Pid), first.state, "stop that daemon, or give this one another --name"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("second daemon said %q, want it to name %q", tail(string(out), 5), want)
		}
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("the refusal took %v", d)
	}
	t.Logf("the second daemon said: %s", tail(strings.TrimSpace(string(out)), 1))

	first.kill()
	start = time.Now()
	second.start()
	t.Logf("a daemon of the name started %v after its holder was SIGKILLed", time.Since(start).Round(time.Millisecond))
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("the start after the holder was SIGKILLed took %v", d)
	}
	second.stop()
	if left := env.Leftovers(context.Background(), broker.LabelBroker+"="+second.name, broker.LabelRole+"=daemon"); len(left) > 0 {
		t.Errorf("a stopped daemon left marks of its name: %v", left)
	}
}

// tenantCA makes a CA and client certificates for the tenancy test.
type tenantCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newTenantCA(t *testing.T) *tenantCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tenancy test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &tenantCA{cert: cert, key: key}
}

var tenantSerial atomic.Int64

// issue returns a certificate for cn (a server's on 127.0.0.1, or a
// client's) and its key.
func (ca *tenantCA) issue(t *testing.T, cn string, server bool) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(tenantSerial.Add(1) + 1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func pemFile(t *testing.T, dir, name, typ string, der []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// The issue's hidden-tests read-out, on a real daemon over mutual TLS:
// tenant A uploads a bundle whose tests are hidden and runs a job on it;
// tenant B, with a certificate of the same CA and A's job id and layer
// digest in hand, reads, waits for, cancels and assesses A's job and
// fetches the layer and A's outputs: each answers 404 as a missing one
// would; a job of B's staging the layer is refused; a certificate that is
// no tenant's gets 403; the admin (the socket peer's uid) sees A's job.
func TestTenantsAreSeparatedOverMTLS(t *testing.T) {
	dir := t.TempDir()
	ca := newTenantCA(t)
	srv := ca.issue(t, "sandboxd", true)
	skey, err := x509.MarshalECPrivateKey(srv.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	tenants := filepath.Join(dir, "tenants.json")
	if err := os.WriteFile(tenants, fmt.Appendf(nil, `{"schema": "sandboxd.tenants/v1", "tenants": [
	  {"name": "ops", "identities": [{"role": "admin", "uids": [%d]}]},
	  {"name": "tenant-a", "identities": [{"role": "submitter", "subjects": ["CN=tenant-a"]}]},
	  {"name": "tenant-b", "identities": [{"role": "submitter", "subjects": ["CN=tenant-b"]}]}]}`, os.Getuid()), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	d := newDaemon(t, "--tenants", tenants, "--listen", addr,
		"--tls-cert", pemFile(t, dir, "server.crt", "CERTIFICATE", srv.Certificate[0]),
		"--tls-key", pemFile(t, dir, "server.key", "EC PRIVATE KEY", skey),
		"--tls-client-ca", pemFile(t, dir, "ca.crt", "CERTIFICATE", ca.cert.Raw))
	d.start()
	ctx := ctxFor(t, 3*time.Minute)
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	tlsClient := func(cn string) (*sbclient.Client, *http.Client) {
		cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{ca.issue(t, cn, false)}}
		c := sbclient.NewTLS("https://"+addr, cfg, d.keys)
		c.PollTimeout = 5 * time.Second
		t.Cleanup(c.Close)
		return c, &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: cfg}}
	}
	a, _ := tlsClient("tenant-a")
	b, bHTTP := tlsClient("tenant-b")
	_, strangerHTTP := tlsClient("stranger")

	layer := env.PutTree(t, map[string]string{"tests/": "", "tests/hidden_test.py": "assert answer() == 42 # " + t.Name()})
	if err := a.PutBlob(ctx, layer, env.Blob(t, layer)); err != nil {
		t.Fatalf("A uploads the bundle layer: %v", err)
	}
	job := env.NewJob(t, testharness.Sh("cat /bundle/tests/hidden_test.py; mkdir -p /work/out; cp /bundle/tests/hidden_test.py /work/out/"), func(j *sandbox.Job) {
		j.Inputs = []sandbox.Input{{Name: "bundle", Digest: layer, Path: sandbox.BundlePath}}
	})
	if _, err := a.Submit(ctx, job); err != nil {
		t.Fatalf("A submits: %v", err)
	}
	sr, err := a.Wait(ctx, job)
	if err != nil || sr.Result.Status != sandbox.StatusSucceeded || len(sr.Result.Artifacts) != 1 {
		t.Fatalf("A waits: %v %+v, want succeeded with one artifact", err, sr.Result)
	}
	if out, err := a.Blob(ctx, sr.Result.Stdout.Digest, 1<<20); err != nil || !strings.Contains(string(out), "answer() == 42") {
		t.Fatalf("A reads its job's stdout: %q %v", out, err)
	}

	raw := func(c *http.Client, method, path string, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, "https://"+addr+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out)
	}
	missingJob := `{"error":"job ` + job.ID + `: not found","code":"not_found"}` + "\n"
	for _, r := range []struct{ method, path, body, want string }{
		{"GET", "/v1/jobs/" + job.ID, "", missingJob},
		{"GET", "/v1/jobs/" + job.ID + "/wait?timeout=1s", "", missingJob},
		{"POST", "/v1/jobs/" + job.ID + "/cancel", "", missingJob},
		{"POST", "/v1/assess", `{"grader_job_id":"` + job.ID + `","candidate_job_id":"` + job.ID + `"}`, `{"error":"grader job: job ` + job.ID + `: not found","code":"not_found"}` + "\n"},
		{"GET", "/v1/blobs/" + layer, "", `{"error":"blob ` + layer + `: blob not found","code":"not_found"}` + "\n"},
		{"GET", "/v1/blobs/" + sr.Result.Stdout.Digest, "", `{"error":"blob ` + sr.Result.Stdout.Digest + `: blob not found","code":"not_found"}` + "\n"},
		{"GET", "/v1/blobs/" + sr.Result.Artifacts[0].Digest, "", `{"error":"blob ` + sr.Result.Artifacts[0].Digest + `: blob not found","code":"not_found"}` + "\n"},
	} {
		if code, body := raw(bHTTP, r.method, r.path, r.body); code != http.StatusNotFound || body != r.want {
			t.Errorf("B %s %s: got %d %s, want 404 %s", r.method, r.path, code, body, r.want)
		}
	}
	if _, err := b.Status(ctx, job.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("B's client Status of A's job: got %v, want not found", err)
	}
	if code, body := raw(bHTTP, "PUT", "/v1/blobs/"+layer, ""); code != http.StatusBadRequest {
		t.Errorf("B's empty PUT of the layer's digest: got %d %s, want 400 (it must upload the bytes)", code, body)
	}
	steal := env.NewJob(t, testharness.Sh("cat /bundle/tests/hidden_test.py"), func(j *sandbox.Job) {
		j.Inputs = []sandbox.Input{{Name: "bundle", Digest: layer, Path: sandbox.BundlePath}}
	})
	var ae *sbclient.APIError
	if _, err := b.Submit(ctx, steal); !errors.As(err, &ae) || ae.StatusCode != http.StatusUnprocessableEntity {
		t.Errorf("B submits a job staging A's layer: got %v, want 422", err)
	}
	for _, p := range []string{"/v1/jobs/" + job.ID, "/v1/identity", "/metrics"} {
		if code, body := raw(strangerHTTP, "GET", p, ""); code != http.StatusForbidden || !strings.Contains(body, `"code":"forbidden"`) {
			t.Errorf("stranger GET %s: got %d %s, want 403", p, code, body)
		}
	}
	if st, err := d.client.Status(ctx, job.ID); err != nil || st.State != sandbox.JobFinished {
		t.Errorf("the admin (socket uid %d) reads A's job: %v %+v", os.Getuid(), err, st)
	}

	// The CLI reaches the daemon over mutual TLS too, as the tenant of its
	// certificate: A's status and wait of its job, B's status of it refused
	// as a missing job (exit 3).
	cli := func(cn string, args ...string) (string, int) {
		c := ca.issue(t, cn, false)
		kder, err := x509.MarshalECPrivateKey(c.PrivateKey.(*ecdsa.PrivateKey))
		if err != nil {
			t.Fatal(err)
		}
		args = append(args[:1:1], append([]string{"--daemon", "https://" + addr, "--tls-ca", pemFile(t, dir, "ca.crt", "CERTIFICATE", ca.cert.Raw),
			"--tls-cert", pemFile(t, dir, cn+".crt", "CERTIFICATE", c.Certificate[0]), "--tls-key", pemFile(t, dir, cn+".key", "EC PRIVATE KEY", kder)}, args[1:]...)...)
		out, err := exec.CommandContext(ctx, binPath, args...).CombinedOutput()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), code
	}
	jobFile := filepath.Join(dir, "job.json")
	jb, _ := json.Marshal(job)
	if err := os.WriteFile(jobFile, jb, 0o600); err != nil {
		t.Fatal(err)
	}
	pubFile := filepath.Join(dir, "daemon.pub")
	if err := os.WriteFile(pubFile, pubPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, code := cli("tenant-a", "status", "--json", job.ID); code != 0 || !strings.Contains(out, `"state":"finished"`) {
		t.Errorf("sandboxd status --daemon as A: exit %d %s, want 0 and the finished job", code, out)
	}
	if out, code := cli("tenant-a", "wait", "--key", pubFile, jobFile); code != 0 {
		t.Errorf("sandboxd wait --daemon as A: exit %d %s, want 0", code, out)
	}
	if out, code := cli("tenant-b", "status", job.ID); code != 3 || !strings.Contains(out, "job "+job.ID+": not found") {
		t.Errorf("sandboxd status --daemon as B: exit %d %s, want 3 and not found", code, out)
	}
	d.stop()
}
