package daemon

import (
	"strconv"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/testharness"
	"github.com/sandboxd/sandboxd/sandbox"
)

// What an earlier process of the daemon's name left mid-way (a container
// filling a cache volume, a selfcheck's job container, neither journaled)
// is removed when the daemon starts, before it runs anything: each held
// the volumes it mounts, and a half-filled one could not be filled again
// (CI: every selfcheck of a restarted fleet host ended error for half a
// minute, and its jobs with it).
func TestStartRemovesWhatAKilledProcessLeft(t *testing.T) {
	d := newDaemon(t)
	ctx := ctxFor(t, 2*time.Minute)
	deadline := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
	left := map[string]map[string]string{
		"populate": {broker.LabelBroker: d.name, broker.LabelRole: "populate"},
		"selfcheck": {broker.LabelBroker: d.name, broker.LabelRole: "job", broker.LabelJob: broker.SelfcheckJobPrefix + randHex(6),
			broker.LabelJobDigest: sandbox.DigestBytes([]byte("selfcheck")), broker.LabelDeadline: deadline},
	}
	ids := map[string]string{}
	for what, labels := range left {
		res, err := env.Eng.ContainerCreate(ctx, client.ContainerCreateOptions{
			Name:       d.name + "-left-" + what,
			Config:     &container.Config{Image: env.Minimal, Entrypoint: []string{"/nonexistent"}, Labels: labels},
			HostConfig: &container.HostConfig{NetworkMode: "none"},
		})
		if err != nil {
			t.Fatalf("create a leftover %s container: %v", what, err)
		}
		ids[what] = res.ID
		t.Cleanup(func() { env.Eng.ContainerRemove(ctx, res.ID, client.ContainerRemoveOptions{Force: true}) })
	}
	d.start()
	for what, id := range ids {
		if _, err := env.Eng.ContainerInspect(ctx, id, client.ContainerInspectOptions{}); err == nil {
			t.Errorf("the %s container an earlier process left is still there after the start", what)
		}
	}
	j := env.NewJob(t, testharness.Sh("echo ran"), nil)
	if _, err := d.client.Submit(ctx, j); err != nil {
		t.Fatal(err)
	}
	if sr, err := d.client.Wait(ctx, j); err != nil || sr.Result.Status != sandbox.StatusSucceeded {
		t.Fatalf("a job after the start: %s, %v (%s)", sr.Result.Status, err, sr.Result.Cause)
	}
	d.stop()
}
