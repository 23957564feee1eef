package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/broker/enginefake"
	"github.com/sandboxd/sandboxd/internal/journal"
	"github.com/sandboxd/sandboxd/internal/receipt"
	"github.com/sandboxd/sandboxd/internal/store"
)

// engineServer is a daemon of broker name on eng, over a state directory
// of its own; it is shut down when the test ends.
func engineServer(t *testing.T, eng *enginefake.Engine, name string, beat time.Duration) *Server {
	t.Helper()
	dir := t.TempDir()
	shimPath := filepath.Join(dir, "shim")
	if err := os.WriteFile(shimPath, enginefake.ShimBinary(), 0o755); err != nil {
		t.Fatal(err)
	}
	blobs, err := store.Open(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	jr, err := journal.Open(filepath.Join(dir, "journal.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { jr.Close() })
	signer, err := receipt.NewEphemeralSigner()
	if err != nil {
		t.Fatal(err)
	}
	bcfg := broker.Default()
	bcfg.Name, bcfg.ShimPath = name, shimPath
	bcfg.NameBeat, bcfg.NameStale = beat, 10*beat
	b, err := broker.New(eng, blobs, bcfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Default()
	cfg.Name = name
	cfg.Broker, cfg.Blobs, cfg.Journal, cfg.Signer = b, blobs, jr, signer
	cfg.ReapGrace, cfg.ReapInterval = time.Hour, time.Hour
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return srv
}

// A second daemon of a broker name that a live daemon holds on the same
// engine (another state directory) refuses to start, naming the first,
// before it touches any container of the name (its start removes the
// populate containers an earlier process of the name left: here, the live
// one's). Once the first stops, a daemon of the name starts.
func TestSecondDaemonOfANameRefusesToStart(t *testing.T) {
	eng := enginefake.New()
	eng.AddImage(testImage)
	first := engineServer(t, eng, "tenant", 50*time.Millisecond)
	if err := first.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	populating, err := eng.ContainerCreate(context.Background(), client.ContainerCreateOptions{Name: "tenant-populate-1",
		Config:     &container.Config{Image: testImage, Labels: map[string]string{broker.LabelBroker: "tenant", broker.LabelRole: "populate"}},
		HostConfig: &container.HostConfig{}})
	if err != nil {
		t.Fatal(err)
	}

	second := engineServer(t, eng, "tenant", 50*time.Millisecond)
	if err := second.Start(context.Background()); !errors.Is(err, broker.ErrNameHeld) || !strings.Contains(err.Error(), first.cfg.Blobs.Dir()) {
		t.Errorf("second start: got %v, want ErrNameHeld naming the first (%s)", err, first.cfg.Blobs.Dir())
	}
	if eng.Container(populating.ID) == nil {
		t.Error("the second daemon removed the live one's populate container")
	}
	if other := engineServer(t, eng, "another", 50*time.Millisecond); other.Start(context.Background()) != nil {
		t.Error("a daemon of another name was refused")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := first.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	third := engineServer(t, eng, "tenant", 50*time.Millisecond)
	if err := third.Start(context.Background()); err != nil {
		t.Fatalf("start after the holder stopped: %v", err)
	}
}

// A daemon that finds its name taken (another process went past its
// mark) stops taking jobs, and says why.
func TestDaemonThatLostItsNameTakesNoJobs(t *testing.T) {
	eng := enginefake.New()
	eng.AddImage(testImage)
	srv := engineServer(t, eng, "tenant", 300*time.Millisecond)
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The next mark, taken by a process elsewhere before this one renews.
	if _, err := eng.VolumeCreate(context.Background(), client.VolumeCreateOptions{Name: "tenant-daemon-2",
		Labels: map[string]string{broker.LabelBroker: "tenant", broker.LabelRole: "daemon", broker.LabelNonce: "theirs", broker.LabelHolder: "the taker"}}); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	deadline := time.Now().Add(5 * time.Second)
	for srv.ready.Load() {
		if time.Now().After(deadline) {
			t.Fatal("still ready after losing its name")
		}
		time.Sleep(20 * time.Millisecond)
	}
	f := &fixture{srv: srv, http: hs}
	resp, body := f.do(t, "POST", "/v1/jobs", mustJSON(t, newJob(t, "after-loss", "true")))
	var e ErrorBody
	json.Unmarshal(body, &e)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(e.Error, "no longer holds its broker name") || !strings.Contains(e.Error, "the taker") {
		t.Errorf("submit: got %d %+v, want 503 saying the name was lost to the taker", resp.StatusCode, e)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
