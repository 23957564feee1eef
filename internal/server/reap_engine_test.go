package server

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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

// The reaper on the real broker over an in-memory engine: labelled job
// containers and pooled sandboxes no live job owns are removed once older
// than the grace period; the young, a live job's, and an unknown one still
// within its deadline (another process's job, maybe) are kept.
func TestReapOnTheBrokerRemovesOnlyWhatNoJobOwns(t *testing.T) {
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
	defer jr.Close()
	signer, err := receipt.NewEphemeralSigner()
	if err != nil {
		t.Fatal(err)
	}
	eng := enginefake.New()
	eng.AddImage(testImage)
	bcfg := broker.Default()
	bcfg.ShimPath = shimPath
	b, err := broker.New(eng, blobs, bcfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Default()
	cfg.Broker, cfg.Blobs, cfg.Journal, cfg.Signer = b, blobs, jr, signer
	cfg.ReapGrace, cfg.ReapInterval = time.Minute, time.Hour
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}

	live := newJob(t, "live", "true")
	canon, err := live.CanonicalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := jr.Accept(live, canon, []byte("{}"), time.Now()); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	past, future := time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
	// The role values are the broker's: "job" and "pool".
	add := func(name, role string, labels map[string]string, created time.Time) string {
		if labels[broker.LabelBroker] == "" {
			labels[broker.LabelBroker] = bcfg.Name
		}
		labels[broker.LabelRole] = role
		res, err := eng.ContainerCreate(context.Background(), client.ContainerCreateOptions{
			Name: name, Config: &container.Config{Image: testImage, Labels: labels}, HostConfig: &container.HostConfig{},
		})
		if err != nil {
			t.Fatal(err)
		}
		eng.Container(res.ID).SetCreated(created)
		return name
	}
	jobLabels := func(id, digest string, deadline time.Time) map[string]string {
		return map[string]string{broker.LabelJob: id, broker.LabelJobDigest: digest, broker.LabelDeadline: strconv.FormatInt(deadline.UnixMilli(), 10)}
	}
	keep := []string{
		add("live-job", "job", jobLabels("live", live.Digest, past), old),
		add("young-unknown", "job", jobLabels("stranger", live.Digest, past), time.Now()),
		add("unknown-within-deadline", "job", jobLabels("stranger2", live.Digest, future), old),
		add("young-stale-pool", "pool", map[string]string{broker.LabelPool: "earlier"}, time.Now()),
		// Another broker name's is never this broker's to reap.
		add("another-brokers", "job", map[string]string{broker.LabelBroker: "other"}, old),
	}
	reap := []string{
		add("unknown-past-deadline", "job", jobLabels("stranger3", live.Digest, past), old),
		add("other-content-same-id", "job", jobLabels("live", "sha256:"+strings.Repeat("0", 64), past), old),
		add("old-stale-pool", "pool", map[string]string{broker.LabelPool: "earlier"}, old),
	}

	if err := srv.reap(context.Background()); err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, id := range eng.Containers() {
		left = append(left, eng.Container(id).Name)
	}
	slices.Sort(left)
	slices.Sort(keep)
	if !slices.Equal(left, keep) {
		t.Errorf("containers left: got %v, want %v (reaped: %v)", left, keep, reap)
	}
}
