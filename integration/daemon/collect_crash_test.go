package daemon

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/testharness"
	"github.com/sandboxd/sandboxd/sandbox"
)

// atLimit is the output limit of the collection crash test: each of its
// three artifacts is a third of it. The newline one is the engine's log
// driver's worst case (a record per newline); the escape one the helper's
// stuffing's (two bytes each).
const atLimit = 3 * (6 << 20)

func collectionJob(t *testing.T) (sandbox.Job, map[string]string) {
	third := atLimit / 3
	var seq strings.Builder
	for i := 1; seq.Len() < third; i++ {
		seq.WriteString(strconv.Itoa(i) + "\n")
	}
	want := map[string]string{
		"/work/out/newlines": strings.Repeat("\n", third),
		"/work/out/escapes":  strings.Repeat("\x1b", third),
		"/work/out/seq":      seq.String()[:third],
	}
	n := strconv.Itoa(third)
	script := "mkdir -p /work/out && cd /work/out" +
		" && head -c " + n + " /dev/zero | tr '\\000' '\\n' > newlines" +
		" && head -c " + n + " /dev/zero | tr '\\000' '\\033' > escapes" +
		" && seq 1 10000000 | head -c " + n + " > seq"
	job := env.NewJob(t, testharness.Sh(script), func(j *sandbox.Job) {
		j.Limits.OutputBytes = atLimit
		j.Limits.DiskBytes = 2 * atLimit
		j.Limits.MemoryBytes = 256 << 20
		j.Limits.WallTimeMS = 60_000
	})
	return job, want
}

// TestSIGKILLDuringCollectionAtTheOutputLimit kills the daemon at each step
// of collecting a job's outputs, at the job's output limit, and restarts
// it: the job is recovered from the container's log as succeeded with
// every artifact whole, it ran once, and the blob store keeps nothing the
// result does not name.
func TestSIGKILLDuringCollectionAtTheOutputLimit(t *testing.T) {
	for _, step := range append(slices.Clone(broker.CollectSteps), "exited") {
		t.Run(step, func(t *testing.T) {
			d := newDaemon(t)
			creations := d.watchCreations()
			job, want := collectionJob(t)
			ctx := ctxFor(t, 4*time.Minute)
			d.start("SANDBOXD_TEST_FAULT=" + step + ":" + job.ID)
			if _, err := d.client.Submit(ctx, job); err != nil {
				t.Fatal(err)
			}
			d.waitExit(3 * time.Minute)
			d.start()
			sr, err := d.client.Wait(ctx, job)
			if err != nil {
				t.Fatalf("wait: %v", err)
			}
			if sr.Result.Status != sandbox.StatusSucceeded {
				t.Fatalf("got %s (%s), want succeeded", sr.Result.Status, sr.Result.Cause)
			}
			names := map[string]bool{sr.Result.Stdout.Digest: true, sr.Result.Stderr.Digest: true}
			for p, content := range want {
				a, ok := sr.Result.Artifact(p)
				sum := sha256.Sum256([]byte(content))
				if !ok || a.Size != int64(len(content)) || a.Digest != "sha256:"+hex.EncodeToString(sum[:]) {
					t.Errorf("artifact %s: got %+v, want %d bytes of digest %x", p, a, len(content), sum)
				}
				names[a.Digest] = true
			}
			if len(sr.Result.Artifacts) != len(want) {
				t.Errorf("got %d artifacts, want %d", len(sr.Result.Artifacts), len(want))
			}
			d.stop()
			byID, _ := creations()
			if byID[job.ID] != 1 {
				t.Errorf("got %d container creations for the job, want exactly 1", byID[job.ID])
			}
			// Nothing of the interrupted collection is left in the store.
			for _, dir := range []string{"sha256", "tmp"} {
				ents, err := os.ReadDir(filepath.Join(d.state, "blobs", dir))
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range ents {
					if dir != "sha256" || !names["sha256:"+e.Name()] {
						t.Errorf("the blob store keeps %s/%s, which the result does not name", dir, e.Name())
					}
				}
			}
		})
	}
}
