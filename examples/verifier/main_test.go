package verifier

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/sandbox/client"
)

// The tests play a verifier against a real daemon: the repository's
// binaries built into a temporary directory, the real engine, a state
// directory and socket of their own. Without an engine they skip, except
// under CI=true, where a missing engine is a failure.

var env struct {
	tmp, bin, repo  string
	image           string
	layout          string // the go-cli bundle with a candidate stage, packed
	pub, otherPub   string // PEM files
	keys, otherKeys sandbox.KeySet
	d               *daemon
}

func TestMain(m *testing.M) {
	code, err := setup(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "verifier tests:", err)
		code = 1
	}
	os.Exit(code)
}

func setup(m *testing.M) (int, error) {
	if err := exec.Command("docker", "info").Run(); err != nil {
		if os.Getenv("CI") == "true" {
			return 1, fmt.Errorf("no container engine answers (CI=true: a failure, not a skip): %v", err)
		}
		fmt.Fprintln(os.Stderr, "verifier tests: no container engine; the tests that need one skip")
		return m.Run(), nil
	}
	tmp, err := os.MkdirTemp("", "sbv-")
	if err != nil {
		return 1, err
	}
	defer os.RemoveAll(tmp)
	env.tmp = tmp
	if env.repo, err = filepath.Abs("../.."); err != nil {
		return 1, err
	}
	env.bin = filepath.Join(tmp, "sandboxd")
	for _, b := range []struct{ pkg, out string }{{"./cmd/sandboxd", "sandboxd"}, {"./cmd/sandboxd-shim", "sandboxd-shim"}, {"./cmd/sandboxd-probe", "sandboxd-probe"}} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(tmp, b.out), b.pkg)
		cmd.Dir = env.repo
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return 1, fmt.Errorf("build %s: %v\n%s", b.pkg, err, out)
		}
	}
	out, err := sandboxd("image", "build", "-q", filepath.Join(env.repo, "images", "go"))
	if err != nil {
		return 1, err
	}
	env.image = strings.TrimSpace(out)
	if err := renderBundle(); err != nil {
		return 1, err
	}
	for _, k := range []struct {
		prefix string
		pem    *string
		keys   *sandbox.KeySet
	}{{"broker", &env.pub, &env.keys}, {"other", &env.otherPub, &env.otherKeys}} {
		if _, err := sandboxd("keygen", "-o", filepath.Join(tmp, k.prefix)); err != nil {
			return 1, err
		}
		*k.pem = filepath.Join(tmp, k.prefix+".pub")
		data, err := os.ReadFile(*k.pem)
		if err != nil {
			return 1, err
		}
		if *k.keys, err = sandbox.ParseKeySet(data); err != nil {
			return 1, err
		}
	}
	d, err := newDaemon()
	if err != nil {
		return 1, err
	}
	env.d = d
	defer d.cleanup()
	if err := d.start(); err != nil {
		return 1, err
	}
	code := m.Run()
	if err := d.stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	return code, nil
}

// sandboxd runs the built CLI and returns its stdout.
func sandboxd(args ...string) (string, error) {
	cmd := exec.Command(env.bin, args...)
	cmd.Env = append(os.Environ(), "SANDBOXD_KEY_PASSWORD=")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("sandboxd %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// renderBundle renders examples/go-cli's bundle with the Go image and a
// candidate stage that exports the workspace's files (the candidate's
// code does not run in it), and packs it.
func renderBundle() error {
	src := filepath.Join(env.repo, "examples", "go-cli")
	dir := filepath.Join(env.tmp, "bundle")
	if err := os.CopyFS(dir, os.DirFS(filepath.Join(src, "bundle"))); err != nil {
		return err
	}
	tmpl, err := os.ReadFile(filepath.Join(src, "bundle.json.in"))
	if err != nil {
		return err
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(strings.ReplaceAll(string(tmpl), "@GO_IMAGE@", env.image)), &m); err != nil {
		return err
	}
	m["candidate"] = map[string]any{"argv": []string{"/bin/sh", "-c", `mkdir -p "$SANDBOXD_EXPORT" && for f in *; do [ "$f" = export ] || cp -R "$f" "$SANDBOXD_EXPORT"/; done`}}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "bundle.json"), data, 0o644); err != nil {
		return err
	}
	env.layout = filepath.Join(env.tmp, "layout")
	_, err = sandboxd("bundle", "pack", dir, "-o", env.layout)
	return err
}

// daemon is one `sandboxd serve` over a state directory that outlives it.
type daemon struct {
	name, dir, state, socket string
	flags                    []string
	cmd                      *exec.Cmd
	done                     chan struct{}
	logs                     *syncBuffer
	client                   *client.Client
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func newDaemon() (*daemon, error) {
	dir, err := os.MkdirTemp("", "sbvd-") // short: unix socket paths are limited
	if err != nil {
		return nil, err
	}
	d := &daemon{name: "sandboxd-verifier-" + randHex(4), dir: dir, state: filepath.Join(dir, "state"), socket: filepath.Join(dir, "s.sock"), logs: &syncBuffer{}}
	d.client = client.New(d.socket, env.keys)
	d.client.PollTimeout = 5 * time.Second
	return d, nil
}

// start runs the daemon with extra environment (a fault) and waits until
// it is ready.
func (d *daemon) start(extraEnv ...string) error {
	d.cmd = exec.Command(env.bin, "serve", "--socket", d.socket, "--state", d.state, "--key", filepath.Join(env.tmp, "broker.key"),
		"--name", d.name, "--reap-grace", "3s", "--drain-timeout", "30s")
	d.cmd.Args = append(d.cmd.Args, d.flags...)
	d.cmd.Env = append(os.Environ(), "SANDBOXD_SHIM="+filepath.Join(env.tmp, "sandboxd-shim"), "SANDBOXD_PROBE="+filepath.Join(env.tmp, "sandboxd-probe"), "SANDBOXD_KEY_PASSWORD=")
	d.cmd.Env = append(d.cmd.Env, extraEnv...)
	d.cmd.Stdout, d.cmd.Stderr = d.logs, d.logs
	if err := d.cmd.Start(); err != nil {
		return err
	}
	d.done = make(chan struct{})
	go func() {
		d.cmd.Wait()
		close(d.done)
	}()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var nd net.Dialer
		return nd.DialContext(ctx, "unix", d.socket)
	}}}
	for deadline := time.Now().Add(time.Minute); ; {
		if resp, err := hc.Get("http://sandboxd/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-d.done:
			return fmt.Errorf("daemon exited at start:\n%s", d.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("daemon not ready after a minute:\n%s", d.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop sends SIGTERM and waits for a clean exit.
func (d *daemon) stop() error {
	if d.cmd == nil {
		return nil
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(time.Minute):
		d.cmd.Process.Kill()
		<-d.done
		return errors.New("daemon did not stop after SIGTERM")
	}
	code := d.cmd.ProcessState.ExitCode()
	d.cmd = nil
	if code != 0 {
		return fmt.Errorf("daemon exited %d after SIGTERM:\n%s", code, d.logs.String())
	}
	return nil
}

// cleanup removes whatever the daemon's broker name labels: containers a
// killed daemon left, and its cache volumes.
func (d *daemon) cleanup() {
	if d.cmd != nil {
		d.cmd.Process.Kill()
		<-d.done
	}
	d.client.Close()
	label := "label=sandboxd.broker=" + d.name
	if out, err := exec.Command("docker", "ps", "-aq", "--filter", label).Output(); err == nil {
		for _, id := range strings.Fields(string(out)) {
			exec.Command("docker", "rm", "-f", id).Run()
		}
	}
	if out, err := exec.Command("docker", "volume", "ls", "-q", "--filter", label).Output(); err == nil {
		for _, v := range strings.Fields(string(out)) {
			exec.Command("docker", "volume", "rm", v).Run()
		}
	}
	os.RemoveAll(d.dir)
}

// creations counts the job containers the daemon created since t, by job id,
// from the engine's event log.
func (d *daemon) creations(t *testing.T, since time.Time) map[string]int {
	t.Helper()
	out, err := exec.Command("docker", "events", "--since", fmt.Sprint(since.Unix()), "--until", fmt.Sprint(time.Now().Add(time.Second).Unix()),
		"--filter", "type=container", "--filter", "event=create", "--filter", "label=sandboxd.broker="+d.name, "--filter", "label=sandboxd.role=job",
		"--format", `{{index .Actor.Attributes "sandboxd.job"}}`).Output()
	if err != nil {
		t.Fatalf("docker events: %v", err)
	}
	n := map[string]int{}
	for _, id := range strings.Fields(string(out)) {
		n[id]++
	}
	return n
}
