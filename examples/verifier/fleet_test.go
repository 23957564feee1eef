package verifier

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/sandbox/fleet"
)

// natsServer starts one nats-server (the build scripts/setup pins) on
// loopback with JetStream, every write synced, and returns its URL.
func natsServer(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("SANDBOXD_NATS_SERVER")
	if bin == "" {
		bin = filepath.Join(env.repo, "bin", "nats", "nats-server")
	}
	if _, err := os.Stat(bin); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no nats-server at %s (scripts/setup builds it), and CI=true: failing", bin)
		}
		t.Skipf("no nats-server at %s: run scripts/setup", bin)
	}
	port := func() int {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port
	}
	client, mon := port(), port()
	dir := t.TempDir()
	conf := filepath.Join(dir, "nats.conf")
	// The store the fleet may reserve, set rather than three quarters of
	// the disk's free space (see internal/testharness/nats.go).
	os.WriteFile(conf, fmt.Appendf(nil, "listen: 127.0.0.1:%d\nhttp: 127.0.0.1:%d\njetstream { store_dir: %q, sync_interval: always, max_file_store: 1099511627776 }\n", client, mon, filepath.Join(dir, "js")), 0o600)
	cmd := exec.Command(bin, "-c", conf)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", mon)); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("nats-server not healthy after 30s")
		}
	}
	return fmt.Sprintf("nats://127.0.0.1:%d", client)
}

// The verifier runs unchanged against a fleet: its Runner and Blobs are
// the fleet's, its plan comes from one host, and its assessment from any:
// a host that ran neither job judges them the same.
func TestVerdictsOverAFleet(t *testing.T) {
	skipWithoutEngine(t)
	url := natsServer(t)
	var hosts []*daemon
	for range 2 {
		d, err := newDaemon()
		if err != nil {
			t.Fatal(err)
		}
		d.flags = []string{"--fleet", url, "--fleet-replicas", "1", "--pool", "0"}
		t.Cleanup(d.cleanup)
		if err := d.start(); err != nil {
			t.Fatal(err)
		}
		hosts = append(hosts, d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	co, err := fleet.Open(ctx, fleet.Options{URLs: []string{url}, Name: "verifier", Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer co.Close()
	runner := fleet.NewRunner(co, env.keys)
	auth, err := sandbox.NewAuthenticity(env.keys)
	if err != nil {
		t.Fatal(err)
	}
	for candidate, want := range map[string]Status{"good": StatusPassed, "bad": StatusFailed} {
		reg, b := register(t, candidate, requiredChecks, nil)
		// Registration uploaded the workspace and the bundle to the host
		// it planned on; over a fleet they go to the fleet's blob store.
		for _, in := range append(reg.Plan.Candidate.Inputs, reg.Plan.Grader.Inputs...) {
			content, err := env.d.client.Blob(ctx, in.Digest, 1<<30)
			if errors.Is(err, sandbox.ErrNotFound) {
				continue // the candidate's export: the verifier uploads it
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := runner.PutBlob(ctx, in.Digest, content); err != nil {
				t.Fatal(err)
			}
		}
		v, err := NewSandboxTestVerifier(SandboxTestConfig{
			Registrations: []Registration{reg}, Runner: runner, Blobs: runner,
			Authenticity: auth, Supervisor: NewDaemonSupervisor(hosts[1].client, b),
		})
		if err != nil {
			t.Fatal(err)
		}
		res, err := v.EvaluateTests(ctx, TestRequest{ManifestDigest: reg.Manifest.Digest})
		if err != nil {
			t.Fatalf("%s over the fleet: %v\nhost 0:\n%s\nhost 1:\n%s", candidate, err, hosts[0].logs.String(), hosts[1].logs.String())
		}
		if res.Status != want {
			t.Errorf("%s over the fleet: %s (%s), want %s", candidate, res.Status, res.Reason, want)
		}
		// Judged again by a host that did not run the grader.
		rec, err := co.Record(ctx, reg.Plan.Grader.ID)
		if err != nil || rec.State != fleet.StateEnded {
			t.Fatalf("%s: the grader's fleet record: %+v, %v", candidate, rec, err)
		}
		other := hosts[0]
		if rec.Host == hosts[0].name {
			other = hosts[1]
		}
		e := evaluation{reg: reg, v: v, b: b}
		a, err := NewDaemonSupervisor(other.client, b).Assess(ctx, observation(t, e))
		if err != nil {
			t.Fatalf("%s: assessed by %s, which did not run the grader (%s did): %v", candidate, other.name, rec.Host, err)
		}
		if got, why := verdict(a.Checks, requiredChecks); got != want {
			t.Errorf("%s: assessed by the other host: %s (%s), want %s", candidate, got, why, want)
		}
	}
	for _, d := range hosts {
		if err := d.stop(); err != nil {
			t.Error(err)
		}
	}
}
