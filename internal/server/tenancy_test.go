package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/evaluate"
	"github.com/sandboxd/sandboxd/internal/supervisor"
	"github.com/sandboxd/sandboxd/sandbox"
)

func TestParseTenants(t *testing.T) {
	good := `{"schema": "sandboxd.tenants/v1", "tenants": [
	  {"name": "ops", "identities": [{"role": "admin", "uids": [0]}]},
	  {"name": "team-a", "identities": [{"role": "submitter", "subjects": ["CN=ci-a"]}, {"role": "reader", "gids": [1001]}],
	   "quota": {"max_limits": {"cpu_millis": 2000}, "max_jobs": 2, "max_blob_bytes": 1073741824}}]}`
	ts, err := ParseTenants("t.json", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if c, _ := ts.lookup(peer{subject: "CN=ci-a"}); c.Quota.MaxBlobBytes != 1<<30 {
		t.Errorf("quota.max_blob_bytes: got %d, want %d", c.Quota.MaxBlobBytes, 1<<30)
	}
	for _, tc := range []struct {
		p          peer
		name, role string
	}{
		{peer{unix: true, uid: 0, gid: 1001}, "ops", "admin"}, // a uid wins over a gid
		{peer{unix: true, uid: 5, gid: 1001}, "team-a", "reader"},
		{peer{subject: "CN=ci-a"}, "team-a", "submitter"},
		{peer{subject: "CN=ci-b"}, "", ""},
		{peer{unix: true, uid: 5, gid: 5}, "", ""},
	} {
		c, ok := ts.lookup(tc.p)
		if ok != (tc.name != "") || ok && (c.Name != tc.name || string(c.Role) != tc.role) {
			t.Errorf("%s: got %v %q %q, want %q %q", tc.p, ok, c.Name, c.Role, tc.name, tc.role)
		}
	}

	for _, tc := range []struct{ name, file, want string }{
		{"unknown field", `{"schema":"sandboxd.tenants/v1","tenants":[{"name":"a","identities":[{"role":"admin","uids":[1]}],"quota":{"max_cpus":1}}]}`, `unknown field "max_cpus"`},
		{"schema", `{"schema":"sandboxd.tenants/v2","tenants":[]}`, `schema "sandboxd.tenants/v2"`},
		{"two values", `{"schema":"sandboxd.tenants/v1","tenants":[{"name":"a","identities":[{"role":"admin","uids":[1]}]}]} {}`, "more than one JSON value"},
		{"no tenants", `{"schema":"sandboxd.tenants/v1","tenants":[]}`, "no tenants"},
		{"bad role", `{"schema":"sandboxd.tenants/v1","tenants":[{"name":"a","identities":[{"role":"root","uids":[1]}]}]}`, `tenants[0] ("a"): identities[0]: role "root"`},
		{"no identities", `{"schema":"sandboxd.tenants/v1","tenants":[{"name":"a"}]}`, `tenants[0] ("a"): no identities`},
		{"empty identity", `{"schema":"sandboxd.tenants/v1","tenants":[{"name":"a","identities":[{"role":"reader"}]}]}`, "identities[0]: no uids, gids, subjects or nats_users"},
		{"duplicate name", `{"schema":"sandboxd.tenants/v1","tenants":[{"name":"a","identities":[{"role":"admin","uids":[1]}]},{"name":"a","identities":[{"role":"admin","uids":[2]}]}]}`, `tenants[1] ("a"): name given twice`},
		{"uid of two tenants", `{"schema":"sandboxd.tenants/v1","tenants":[{"name":"a","identities":[{"role":"admin","uids":[1]}]},{"name":"b","identities":[{"role":"reader","uids":[1]}]}]}`, `tenants[1] ("b"): identities[0]: uid 1 is tenant "a"'s already`},
		{"subject of two tenants", `{"schema":"sandboxd.tenants/v1","tenants":[{"name":"a","identities":[{"role":"admin","subjects":["CN=x"]}]},{"name":"b","identities":[{"role":"reader","subjects":["CN=x"]}]}]}`, `subject "CN=x" is tenant "a"'s already`},
		{"nats user of two tenants", `{"schema":"sandboxd.tenants/v1","tenants":[{"name":"a","identities":[{"role":"submitter","nats_users":["ci"]}]},{"name":"b","identities":[{"role":"reader","nats_users":["ci"]}]}]}`, `tenants[1] ("b"): identities[0]: nats user "ci" is tenant "a"'s already`},
		{"nats user not a name", `{"schema":"sandboxd.tenants/v1","tenants":[{"name":"a","identities":[{"role":"submitter","nats_users":["ci.a"]}]}]}`, `nats user "ci.a" is not 1-64 characters of [A-Za-z0-9_-]`},
		{"negative quota", `{"schema":"sandboxd.tenants/v1","tenants":[{"name":"a","identities":[{"role":"admin","uids":[1]}],"quota":{"max_limits":{"memory_bytes":-1}}}]}`, "quota.max_limits.memory_bytes -1 is negative"},
		{"negative blob quota", `{"schema":"sandboxd.tenants/v1","tenants":[{"name":"a","identities":[{"role":"admin","uids":[1]}],"quota":{"max_blob_bytes":-1}}]}`, `tenants[0] ("a"): quota.max_blob_bytes -1 is negative`},
		{"blob quota not a number", `{"schema":"sandboxd.tenants/v1","tenants":[{"name":"a","identities":[{"role":"admin","uids":[1]}],"quota":{"max_blob_bytes":"1G"}}]}`, `tenants.quota.max_blob_bytes of type int64`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseTenants("/etc/sandboxd/tenants.json", []byte(tc.file))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "tenants file /etc/sandboxd/tenants.json") || !errors.Is(err, sandbox.ErrInvalid) {
				t.Fatalf("got %v, want an invalid-input error naming the file and containing %q", err, tc.want)
			}
		})
	}
}

// tenancyRig serves one server with tenants on a real unix socket (the
// test process's uid is the admin) and on mutual TLS (one client
// certificate per tenant, and a stranger's).
type tenancyRig struct {
	f                    *fixture
	admin, a, b, aReader *http.Client
	stranger             *http.Client
	socketURL, tlsURL    string
}

func newTenancyRig(t *testing.T, quota string, mod func(*Config)) *tenancyRig {
	t.Helper()
	file := fmt.Sprintf(`{"schema": "sandboxd.tenants/v1", "tenants": [
	  {"name": "ops", "identities": [{"role": "admin", "uids": [%d]}]},
	  {"name": "tenant-a", "identities": [{"role": "submitter", "subjects": ["CN=tenant-a"]}, {"role": "reader", "subjects": ["CN=tenant-a-reader"]}]%s},
	  {"name": "tenant-b", "identities": [{"role": "submitter", "subjects": ["CN=tenant-b"]}]}]}`, os.Getuid(), quota)
	ts, err := ParseTenants("tenants.json", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, func(c *Config) {
		c.Tenants = ts
		if mod != nil {
			mod(c)
		}
	}, nil)
	r := &tenancyRig{f: f}
	hs := &http.Server{Handler: f.srv.Handler(), ConnContext: f.srv.ConnContext, ReadHeaderTimeout: 10 * time.Second}
	serve := func(ln net.Listener) {
		done := make(chan error, 1)
		go func() { done <- hs.Serve(ln) }()
		t.Cleanup(func() { hs.Close(); <-done })
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "s.sock")
	uln, err := ListenUnix(sock)
	if err != nil {
		t.Fatal(err)
	}
	serve(uln)
	r.socketURL = "http://sandboxd"
	r.admin = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}

	serverCA, clientCA := newTestCA(t, "server CA"), newTestCA(t, "client CA")
	srvCert, srvKey := serverCA.issue(t, "sandboxd", true)
	tln, err := ListenTLS("127.0.0.1:0", writeFile(t, dir, "server.crt", srvCert), writeFile(t, dir, "server.key", srvKey), writeFile(t, dir, "ca.crt", clientCA.pem))
	if err != nil {
		t.Fatal(err)
	}
	serve(tln)
	r.tlsURL = "https://" + tln.Addr().String()
	roots := x509.NewCertPool()
	roots.AddCert(serverCA.cert)
	client := func(cn string) *http.Client {
		certPEM, keyPEM := clientCA.issue(t, cn, false)
		c, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{c}}
		return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	}
	r.a, r.b, r.aReader, r.stranger = client("tenant-a"), client("tenant-b"), client("tenant-a-reader"), client("stranger")
	return r
}

// do makes a request as c (the admin over the socket, any other over mTLS).
func (r *tenancyRig) do(t *testing.T, c *http.Client, method, path string, body []byte) (int, []byte) {
	t.Helper()
	base := r.tlsURL
	if c == r.admin {
		base = r.socketURL
	}
	req, err := http.NewRequest(method, base+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func (r *tenancyRig) submit(t *testing.T, c *http.Client, j sandbox.Job) (int, []byte) {
	t.Helper()
	body, _ := json.Marshal(j)
	return r.do(t, c, "POST", "/v1/jobs", body)
}

// TestTenantsSeparateJobsAndBlobs is the issue's hidden-tests read-out:
// tenant A uploads a bundle layer and runs a job on it; tenant B, knowing
// (or guessing) the job id and the layer's digest, gets from every route
// exactly what a missing job or blob answers, and cannot lease, stage or
// re-upload its way to the layer. The admin (over the unix socket,
// identified by SO_PEERCRED) sees everything; a stranger nothing.
func TestTenantsSeparateJobsAndBlobs(t *testing.T) {
	assessments, err := supervisor.NewDirStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r := newTenancyRig(t, "", func(c *Config) { c.Supervisor = supervisor.New(assessments) })
	r.f.fb.outputs = true
	hidden := []byte("hidden tests: assert answer == 42\n")
	layer := sandbox.DigestBytes(hidden)
	if code, b := r.do(t, r.a, "PUT", "/v1/blobs/"+layer, hidden); code != http.StatusCreated {
		t.Fatalf("A uploads the layer: got %d %s, want 201", code, b)
	}
	job := newJobWithInput(t, "a-grader", layer)
	if code, b := r.submit(t, r.a, job); code != http.StatusAccepted {
		t.Fatalf("A submits: got %d %s, want 202", code, b)
	}
	if code, b := r.do(t, r.a, "GET", "/v1/jobs/a-grader/wait?timeout=20s", nil); code != http.StatusOK || !bytes.Contains(b, []byte(`"state":"finished"`)) {
		t.Fatalf("A waits: got %d %s, want 200 finished", code, b)
	}
	// The fake writes no blobs: the artifact the job names is stored here.
	art := []byte("artifact of a-grader")
	if d, err := r.f.srv.cfg.Blobs.PutBytes(art); err != nil || d != fakeArtifact("a-grader") {
		t.Fatalf("store the artifact: %v %s", err, d)
	}

	// What a missing job and a missing blob answer, for the comparison.
	missingJob := func(path string) []byte {
		_, b := r.do(t, r.b, strings.SplitN(path, " ", 2)[0], strings.ReplaceAll(strings.SplitN(path, " ", 2)[1], "a-grader", "no-such-job"), nil)
		return bytes.ReplaceAll(b, []byte("no-such-job"), []byte("a-grader"))
	}
	absent := sandbox.DigestBytes([]byte("absent"))
	missingBlob := func(d string) []byte {
		_, b := r.do(t, r.b, "GET", "/v1/blobs/"+absent, nil)
		return bytes.ReplaceAll(b, []byte(absent), []byte(d))
	}
	for _, route := range []string{"GET /v1/jobs/a-grader", "GET /v1/jobs/a-grader/wait?timeout=1s", "POST /v1/jobs/a-grader/cancel"} {
		code, b := r.do(t, r.b, strings.SplitN(route, " ", 2)[0], strings.SplitN(route, " ", 2)[1], nil)
		if want := missingJob(route); code != http.StatusNotFound || !bytes.Equal(b, want) {
			t.Errorf("B %s: got %d %s, want 404 %s", route, code, b, want)
		}
	}
	for _, d := range []string{layer, fakeArtifact("a-grader"), fakeStdout("a-grader")} {
		code, b := r.do(t, r.b, "GET", "/v1/blobs/"+d, nil)
		if want := missingBlob(d); code != http.StatusNotFound || !bytes.Equal(b, want) {
			t.Errorf("B GET blob %s: got %d %s, want 404 %s", d, code, b, want)
		}
	}
	assess, _ := json.Marshal(sandbox.AssessRequest{GraderJobID: "a-grader", CandidateJobID: "a-grader"})
	if code, b := r.do(t, r.b, "POST", "/v1/assess", assess); code != http.StatusNotFound || !strings.Contains(string(b), "grader job: job a-grader: not found") {
		t.Errorf("B assesses A's job: got %d %s, want 404 as a missing job", code, b)
	}
	// An empty PUT of the digest would lease a stored blob: for B it is an
	// upload that does not hash to the digest, and grants nothing.
	if code, b := r.do(t, r.b, "PUT", "/v1/blobs/"+layer, nil); code != http.StatusBadRequest {
		t.Errorf("B's empty PUT of the layer: got %d %s, want 400", code, b)
	}
	if code, b := r.do(t, r.b, "GET", "/v1/blobs/"+layer, nil); code != http.StatusNotFound {
		t.Errorf("B GET the layer after an empty PUT: got %d %s, want 404", code, b)
	}
	// A job of B's staging the layer would print it: refused as if the
	// layer were missing.
	if code, b := r.submit(t, r.b, newJobWithInput(t, "b-steal", layer)); code != http.StatusUnprocessableEntity || !strings.Contains(string(b), "blob "+layer+": blob not found") {
		t.Errorf("B stages A's layer: got %d %s, want 422 as a missing blob", code, b)
	}
	// A's job id is taken, but nothing of A's job is told.
	if code, b := r.submit(t, r.b, newJob(t, "a-grader", "true")); code != http.StatusConflict || bytes.Contains(b, []byte("sha256:")) {
		t.Errorf("B reuses A's job id: got %d %s, want 409 naming no digest", code, b)
	}

	// The owner, its reader and the admin see it all; the reader writes nothing.
	for _, who := range []struct {
		name string
		c    *http.Client
	}{{"A", r.a}, {"A's reader", r.aReader}, {"admin", r.admin}} {
		for _, p := range []string{"/v1/jobs/a-grader", "/v1/jobs/a-grader/wait?timeout=1s", "/v1/blobs/" + layer, "/v1/blobs/" + fakeArtifact("a-grader")} {
			if code, b := r.do(t, who.c, "GET", p, nil); code != http.StatusOK {
				t.Errorf("%s GET %s: got %d %s, want 200", who.name, p, code, b)
			}
		}
	}
	if code, b := r.do(t, r.aReader, "POST", "/v1/jobs/a-grader/cancel", nil); code != http.StatusForbidden || !strings.Contains(string(b), `"code":"forbidden"`) {
		t.Errorf("A's reader cancels: got %d %s, want 403", code, b)
	}
	if code, b := r.do(t, r.a, "POST", "/v1/jobs/a-grader/cancel", nil); code != http.StatusAccepted {
		t.Errorf("A cancels its ended job: got %d %s, want 202", code, b)
	}
	// B may use what it uploads itself, the same bytes included.
	if code, b := r.do(t, r.b, "PUT", "/v1/blobs/"+layer, hidden); code != http.StatusCreated {
		t.Errorf("B uploads the same bytes: got %d %s, want 201", code, b)
	}
	if code, b := r.do(t, r.b, "GET", "/v1/blobs/"+layer, nil); code != http.StatusOK {
		t.Errorf("B GET what it uploaded: got %d %s, want 200", code, b)
	}

	for _, p := range []string{"/v1/jobs/a-grader", "/v1/identity", "/metrics"} {
		if code, b := r.do(t, r.stranger, "GET", p, nil); code != http.StatusForbidden || !strings.Contains(string(b), `client certificate \"CN=stranger\" is no tenant`) {
			t.Errorf("stranger GET %s: got %d %s, want 403 naming it", p, code, b)
		}
	}
	for _, p := range []string{"/metrics", "/v1/gc"} {
		method := map[string]string{"/metrics": "GET", "/v1/gc": "POST"}[p]
		if code, _ := r.do(t, r.a, method, p, nil); code != http.StatusForbidden {
			t.Errorf("A %s %s: got %d, want 403 (admins only)", method, p, code)
		}
		if code, b := r.do(t, r.admin, method, p, nil); code != http.StatusOK {
			t.Errorf("admin %s %s: got %d %s, want 200", method, p, code, b)
		}
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		if code, _ := r.do(t, r.stranger, "GET", p, nil); code != http.StatusOK {
			t.Errorf("stranger GET %s: got %d, want 200 (open to every peer)", p, code)
		}
	}
}

// TestTenantQuotas: a limit over the tenant's max_limits is refused 403
// naming it; a submission beyond max_jobs queued and running gets 429 with
// Retry-After naming it; an idempotent resubmission is answered anyway.
func TestTenantQuotas(t *testing.T) {
	r := newTenancyRig(t, `, "quota": {"max_limits": {"cpu_millis": 1000, "wall_time_ms": 600000}, "max_jobs": 1, "max_upload_bytes": 100}`, nil)
	first60, second60 := bytes.Repeat([]byte("a"), 60), bytes.Repeat([]byte("b"), 60)
	if code, b := r.do(t, r.a, "PUT", "/v1/blobs/"+sandbox.DigestBytes(first60), first60); code != http.StatusCreated {
		t.Fatalf("A's first upload: got %d %s, want 201", code, b)
	}
	if code, b := r.do(t, r.a, "PUT", "/v1/blobs/"+sandbox.DigestBytes(second60), second60); code != http.StatusInsufficientStorage ||
		!strings.Contains(string(b), "its quota max_upload_bytes 100") || !strings.Contains(string(b), `"code":"quota_exceeded"`) {
		t.Errorf("A's second upload: got %d %s, want 507 naming the quota", code, b)
	}
	if code, b := r.do(t, r.b, "PUT", "/v1/blobs/"+sandbox.DigestBytes(second60), second60); code != http.StatusCreated {
		t.Errorf("B's upload: got %d %s, want 201 (A's quota is A's)", code, b)
	}
	// A job naming the first upload takes it off the quota.
	if code, b := r.submit(t, r.a, newJobWithInput(t, "a-uses", sandbox.DigestBytes(first60))); code != http.StatusAccepted {
		t.Fatalf("A submits a job naming its upload: got %d %s", code, b)
	}
	if code, b := r.do(t, r.admin, "GET", "/v1/jobs/a-uses/wait?timeout=20s", nil); code != http.StatusOK || !bytes.Contains(b, []byte(`"state":"finished"`)) {
		t.Fatalf("the job naming the upload: got %d %s", code, b)
	}
	if code, b := r.do(t, r.a, "PUT", "/v1/blobs/"+sandbox.DigestBytes(second60), second60); code != http.StatusCreated && code != http.StatusOK {
		t.Errorf("A's second upload once the first is named: got %d %s, want it stored", code, b)
	}
	big := newJob(t, "a-big", "true")
	big.Limits.CPUMillis = 2000
	big.Digest = ""
	if err := big.Seal(); err != nil {
		t.Fatal(err)
	}
	if code, b := r.submit(t, r.a, big); code != http.StatusForbidden || !strings.Contains(string(b), `job.limits.cpu_millis 2000 is over tenant \"tenant-a\"'s quota max_limits.cpu_millis 1000`) || !strings.Contains(string(b), `"code":"quota_exceeded"`) {
		t.Errorf("over max_limits: got %d %s, want 403 naming the quota", code, b)
	}
	gate := make(chan struct{})
	r.f.fb.mu.Lock()
	r.f.fb.gates["a-1"] = gate
	r.f.fb.mu.Unlock()
	defer close(gate)
	first := newJob(t, "a-1", "true")
	if code, b := r.submit(t, r.a, first); code != http.StatusAccepted {
		t.Fatalf("first job: got %d %s, want 202", code, b)
	}
	body, _ := json.Marshal(newJob(t, "a-2", "true"))
	req, _ := http.NewRequest("POST", r.tlsURL+"/v1/jobs", bytes.NewReader(body))
	resp, err := r.a.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(b), "its quota max_jobs is 1") || !strings.Contains(string(b), `"code":"quota_exceeded"`) {
		t.Errorf("over max_jobs: got %d (Retry-After %q) %s, want 429 naming the quota", resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
	if code, b := r.submit(t, r.a, first); code != http.StatusOK {
		t.Errorf("resubmitting the running job: got %d %s, want 200", code, b)
	}
	// Another tenant's quota is its own.
	if code, b := r.submit(t, r.b, newJob(t, "b-1", "true")); code != http.StatusAccepted {
		t.Errorf("B's job: got %d %s, want 202", code, b)
	}
}

func newJobWithInput(t *testing.T, id, digest string) sandbox.Job {
	t.Helper()
	j := sandbox.Job{Schema: sandbox.JobSchema, ID: id, Image: testImage, Argv: []string{"true"}, WorkDir: sandbox.WorkPath,
		Limits: sandbox.DefaultLimits(), Network: sandbox.NetworkNone, Runtime: sandbox.RuntimeRunc,
		Inputs: []sandbox.Input{{Name: "bundle", Digest: digest, Path: sandbox.BundlePath}}}
	if err := j.Seal(); err != nil {
		t.Fatal(err)
	}
	return j
}

// TestTenantsReload: a tenants file read again takes effect from the next
// request (an identity moved to another tenant, a role changed, one
// removed); a file that does not decode changes nothing and its error
// names the file; every job keeps the owner it was accepted for.
func TestTenantsReload(t *testing.T) {
	r := newTenancyRig(t, "", nil)
	ts := r.f.srv.cfg.Tenants
	if code, b := r.submit(t, r.a, newJob(t, "a-before", "true")); code != http.StatusAccepted {
		t.Fatalf("A submits: got %d %s, want 202", code, b)
	}
	if code, b := r.do(t, r.a, "GET", "/v1/jobs/a-before/wait?timeout=20s", nil); code != http.StatusOK || !bytes.Contains(b, []byte(`"state":"finished"`)) {
		t.Fatalf("A waits: got %d %s, want 200 finished", code, b)
	}
	// A becomes a reader of its tenant; B's certificate now acts for a new
	// tenant-c; A's reader certificate is no one's.
	next := fmt.Sprintf(`{"schema": "sandboxd.tenants/v1", "tenants": [
	  {"name": "ops", "identities": [{"role": "admin", "uids": [%d]}]},
	  {"name": "tenant-a", "identities": [{"role": "reader", "subjects": ["CN=tenant-a"]}]},
	  {"name": "tenant-c", "identities": [{"role": "submitter", "subjects": ["CN=tenant-b"]}], "quota": {"max_jobs": 1}}]}`, os.Getuid())
	if err := ts.Reload([]byte(next)); err != nil {
		t.Fatalf("reload: %v", err)
	}
	after := func() {
		t.Helper()
		if code, b := r.do(t, r.a, "GET", "/v1/jobs/a-before", nil); code != http.StatusOK {
			t.Errorf("A reads its job: got %d %s, want 200", code, b)
		}
		if code, b := r.submit(t, r.a, newJob(t, "a-after", "true")); code != http.StatusForbidden || !strings.Contains(string(b), `tenant \"tenant-a\" (role reader) may not POST`) {
			t.Errorf("A, a reader now, submits: got %d %s, want 403", code, b)
		}
		if code, b := r.do(t, r.b, "GET", "/v1/jobs/a-before", nil); code != http.StatusNotFound {
			t.Errorf("tenant-c reads A's job: got %d %s, want 404", code, b)
		}
		if code, b := r.do(t, r.aReader, "GET", "/v1/jobs/a-before", nil); code != http.StatusForbidden || !strings.Contains(string(b), "is no tenant of this daemon (tenants.json)") {
			t.Errorf("a removed identity: got %d %s, want 403", code, b)
		}
	}
	after()
	if code, b := r.submit(t, r.b, newJob(t, "c-1", "true")); code != http.StatusAccepted {
		t.Fatalf("tenant-c submits: got %d %s, want 202", code, b)
	}
	for id, owner := range map[string]string{"a-before": "tenant-a", "c-1": "tenant-c"} {
		if rec, err := r.f.jr.Get(id); err != nil || rec.Tenant != owner {
			t.Errorf("job %s: owner %q (%v), want %q", id, rec.Tenant, err, owner)
		}
	}

	for _, bad := range []struct{ name, file, want string }{
		{"not JSON", `{"schema": "sandboxd.tenants/v1", "tenants": [`, "tenants file tenants.json: unexpected EOF"},
		{"bad quota", `{"schema":"sandboxd.tenants/v1","tenants":[{"name":"x","identities":[{"role":"admin","subjects":["CN=tenant-a"]}],"quota":{"max_blob_bytes":-5}}]}`,
			`tenants file tenants.json: tenants[0] ("x"): quota.max_blob_bytes -5 is negative`},
	} {
		err := ts.Reload([]byte(bad.file))
		if err == nil || !strings.Contains(err.Error(), bad.want) || !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("reload of a file %s: got %v, want an error containing %q", bad.name, err, bad.want)
		}
		// The tenants read before stand.
		after()
		if code, b := r.do(t, r.b, "GET", "/v1/jobs/c-1", nil); code != http.StatusOK {
			t.Errorf("after a reload of a file %s, tenant-c reads its job: got %d %s, want 200", bad.name, code, b)
		}
	}
}

// TestRetainedAssessmentsAreTheirTenants: the daemon reads a retained
// assessment back only through POST /v1/assess, for the jobs it judges,
// and those are the asker's own: tenant B gets, for A's grader or A's
// candidate, what a missing job answers, never A's retained assessment;
// B running the same evaluation itself gets an assessment of its own jobs.
func TestRetainedAssessmentsAreTheirTenants(t *testing.T) {
	assessments, err := supervisor.NewDirStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r := newTenancyRig(t, "", func(c *Config) {
		c.Preflight = func(context.Context, sandbox.Job) error { return nil }
		c.Supervisor = supervisor.New(assessments)
		c.MaxBlobBytes = 1 << 20 // the bundle's layer
	})
	b, blob := exampleBundle(t)
	bm := b.Manifest
	workspace := []byte("workspace")
	ws := sandbox.DigestBytes(workspace)
	export, err := evaluate.ExportOf(context.Background(), r.f.srv.cfg.Blobs, sandbox.Result{}, bm.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	exportBytes := readBlob(t, r, export)
	// runEvaluation runs one tenant's evaluation and returns its
	// assessment request.
	runEvaluation := func(c *http.Client, cand, grader string) []byte {
		t.Helper()
		for d, data := range map[string][]byte{ws: workspace, b.LayerDigest: blob(b.LayerDigest), export: exportBytes} {
			if code, out := r.do(t, c, "PUT", "/v1/blobs/"+d, data); code/100 != 2 {
				t.Fatalf("upload %s: got %d %s", d, code, out)
			}
		}
		jobs := []sandbox.Job{evalOf(t, bm, b.Digest, "", "").CandidateJob(ws, cand), evalOf(t, bm, b.Digest, b.LayerDigest, "").GraderJob(export, grader)}
		for _, j := range jobs {
			if err := j.Seal(); err != nil {
				t.Fatal(err)
			}
			if code, out := r.submit(t, c, j); code != http.StatusAccepted {
				t.Fatalf("submit %s: got %d %s", j.ID, code, out)
			}
			if code, out := r.do(t, c, "GET", "/v1/jobs/"+j.ID+"/wait?timeout=20s", nil); code != http.StatusOK || !bytes.Contains(out, []byte(`"state":"finished"`)) {
				t.Fatalf("wait %s: got %d %s", j.ID, code, out)
			}
		}
		body, _ := json.Marshal(sandbox.AssessRequest{BundleManifest: blob(b.Digest), BundleConfig: blob(b.ConfigDigest), GraderJobID: grader, CandidateJobID: cand, WorkspaceDigest: ws})
		return body
	}
	reqA := runEvaluation(r.a, "a-cand", "a-grader")
	code, first := r.do(t, r.a, "POST", "/v1/assess", reqA)
	if code != http.StatusOK {
		t.Fatalf("A assesses: got %d %s, want 200", code, first)
	}
	if n, _ := assessments.Len(context.Background()); n == 0 {
		t.Fatal("no assessment retained")
	}

	ask := func(grader, cand string) (int, []byte) {
		var req sandbox.AssessRequest
		json.Unmarshal(reqA, &req)
		req.GraderJobID, req.CandidateJobID = grader, cand
		body, _ := json.Marshal(req)
		return r.do(t, r.b, "POST", "/v1/assess", body)
	}
	_, missing := ask("no-such-grader", "a-cand")
	if code, out := ask("a-grader", "a-cand"); code != http.StatusNotFound || !bytes.Equal(out, bytes.ReplaceAll(missing, []byte("no-such-grader"), []byte("a-grader"))) {
		t.Errorf("B asks for A's retained assessment: got %d %s, want 404 %s", code, out, missing)
	}
	reqB := runEvaluation(r.b, "b-cand", "b-grader")
	if code, out := ask("b-grader", "a-cand"); code != http.StatusNotFound || !strings.Contains(string(out), "candidate job: job a-cand: not found") {
		t.Errorf("B's grader with A's candidate: got %d %s, want 404 as a missing job", code, out)
	}
	code, own := r.do(t, r.b, "POST", "/v1/assess", reqB)
	if code != http.StatusOK || bytes.Equal(own, first) {
		t.Fatalf("B assesses its own jobs: got %d (A's bytes: %v) %s, want 200 and an assessment of its own", code, bytes.Equal(own, first), own)
	}
	var resp sandbox.AssessResponse
	if err := json.Unmarshal(own, &resp); err != nil {
		t.Fatal(err)
	}
	var bc, bg sandbox.Job
	for id, j := range map[string]*sandbox.Job{"b-cand": &bc, "b-grader": &bg} {
		rec, err := r.f.jr.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		if *j, err = rec.DecodeJob(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := sandbox.VerifyAssessment(r.f.keys, resp.Assessment, bc, bg); err != nil {
		t.Errorf("B's assessment does not bind B's jobs: %v", err)
	}
	// A asked again gets its own bytes, retained.
	if code, again := r.do(t, r.a, "POST", "/v1/assess", reqA); code != http.StatusOK || !bytes.Equal(again, first) {
		t.Errorf("A asks again: got %d, identical %v; want its retained bytes", code, bytes.Equal(again, first))
	}
}

// readBlob reads a stored blob as the admin.
func readBlob(t *testing.T, r *tenancyRig, d string) []byte {
	t.Helper()
	code, b := r.do(t, r.admin, "GET", "/v1/blobs/"+d, nil)
	if code != http.StatusOK {
		t.Fatalf("read blob %s: got %d %s", d, code, b)
	}
	return b
}

// A reload that takes calls the OnReload hooks (a fleet host makes new
// tenants' stores then); one that does not take calls none.
func TestTenantsOnReload(t *testing.T) {
	file := func(names ...string) []byte {
		var ts []string
		for i, n := range names {
			ts = append(ts, fmt.Sprintf(`{"name":%q,"identities":[{"role":"submitter","uids":[%d]}]}`, n, 100+i))
		}
		return []byte(`{"schema":"sandboxd.tenants/v1","tenants":[` + strings.Join(ts, ",") + `]}`)
	}
	ts, err := ParseTenants("t.json", file("team-a"))
	if err != nil {
		t.Fatal(err)
	}
	var seen [][]string
	ts.OnReload(func() {
		var names []string
		for _, x := range ts.List() {
			names = append(names, x.Name)
		}
		seen = append(seen, names)
	})
	if err := ts.Reload([]byte("{")); err == nil {
		t.Fatal("a file that does not decode was taken")
	}
	if err := ts.Reload(file("team-a", "team-c")); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 1 || !slices.Equal(seen[0], []string{"team-a", "team-c"}) {
		t.Errorf("hooks saw %v, want one call with team-a and team-c", seen)
	}
}

// A unix peer's supplementary groups (SO_PEERGROUPS) name its tenant
// when neither its uid nor its primary gid does; groups naming two
// tenants (or one in two roles) name none. Before, only the primary gid
// was seen: a user of a tenant's group by membership got 403.
func TestLookupBySupplementaryGroups(t *testing.T) {
	ts, err := ParseTenants("t.json", []byte(`{"schema":"sandboxd.tenants/v1","tenants":[
	 {"name":"team-a","identities":[{"role":"submitter","gids":[1001]},{"role":"reader","gids":[1003]}]},
	 {"name":"team-b","identities":[{"role":"submitter","gids":[1002]}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		p          peer
		name, role string
	}{
		{peer{unix: true, uid: 5, gid: 5, groups: []uint32{5, 1001}}, "team-a", "submitter"},
		{peer{unix: true, uid: 5, gid: 1002, groups: []uint32{1001}}, "team-b", "submitter"}, // the primary gid first
		{peer{unix: true, uid: 5, gid: 5, groups: []uint32{1001, 1002}}, "", ""},             // two tenants
		{peer{unix: true, uid: 5, gid: 5, groups: []uint32{1001, 1003}}, "", ""},             // two roles
		{peer{unix: true, uid: 5, gid: 5, groups: []uint32{7, 8}}, "", ""},
	} {
		c, ok := ts.lookup(tc.p)
		if ok != (tc.name != "") || ok && (c.Name != tc.name || string(c.Role) != tc.role) {
			t.Errorf("groups %v: got %v %q %q, want %q %q", tc.p.groups, ok, c.Name, c.Role, tc.name, tc.role)
		}
	}
}

// unixPeer reads the peer's supplementary groups as the kernel recorded
// them at connect: a peer started with groups 4242 and 4243 (as root, as
// CI runs), or else this process's own.
func TestUnixPeerGroups(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var want []uint32
	if os.Getuid() == 0 {
		want = []uint32{4242, 4243}
		cmd := exec.Command("python3", "-c", "import socket,sys,time; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); time.sleep(2)", sock)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 0, Gid: 0, Groups: want}}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer cmd.Wait()
		defer cmd.Process.Kill()
	} else {
		own, err := os.Getgroups()
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range own {
			want = append(want, uint32(g))
		}
		go func() {
			if c, err := net.Dial("unix", sock); err == nil {
				defer c.Close()
				time.Sleep(time.Second)
			}
		}()
	}
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := unixPeer(c.(*net.UnixConn))
	if err != nil {
		t.Fatal(err)
	}
	got := slices.Clone(p.groups)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("peer groups %v, want %v", got, want)
	}
}
