package selfcheck

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/broker/enginefake"
	"github.com/sandboxd/sandboxd/internal/server"
	"github.com/sandboxd/sandboxd/internal/shim"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/sandbox"
)

// The daemon checks a gated job before it journals it dispatched.
var _ server.Prechecker = GatedBroker{}

// A gated job reaches the broker only once its own key passed: a failed
// check means the broker never touches the engine (the in-memory engine
// counts every call), and the key is the job's Image and Runtime on the
// gate's engine.
func TestGatedBrokerRunsOnlyCheckedKeys(t *testing.T) {
	failed := errors.New("the seccomp property did not hold")
	for _, c := range []struct {
		name      string
		fail      error
		wantCalls bool // whether the broker called the engine
	}{
		{"check passed: the broker runs the job", nil, true},
		{"check failed: the broker is never called", failed, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			shimPath := filepath.Join(dir, "sandboxd-shim")
			if err := os.WriteFile(shimPath, enginefake.ShimBinary(), 0o755); err != nil {
				t.Fatal(err)
			}
			blobs, err := store.Open(filepath.Join(dir, "blobs"))
			if err != nil {
				t.Fatal(err)
			}
			image := "sha256:" + strings.Repeat("c", 64)
			eng := enginefake.New()
			eng.AddImage(image)
			eng.Program = enginefake.Helper("hi", shim.Status{}, nil)
			cfg := broker.Default()
			cfg.ShimPath, cfg.EngineTimeout = shimPath, 10*time.Second
			b, err := broker.New(eng, blobs, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(b.ClosePool)

			var checked []GateKey
			gate := NewGate(func(_ context.Context, k GateKey) error {
				checked = append(checked, k)
				return c.fail
			})
			g := GatedBroker{Broker: b, Gate: gate, Engine: "engine-a"}
			job := sandbox.Job{Schema: sandbox.JobSchema, ID: "gated", Image: image, Argv: []string{"true"}, WorkDir: sandbox.WorkPath,
				Limits: sandbox.DefaultLimits(), Network: sandbox.NetworkNone, Runtime: sandbox.RuntimeRunc}
			if err := job.Seal(); err != nil {
				t.Fatal(err)
			}

			before := len(eng.Calls())
			res, err := g.Run(context.Background(), job)
			calls := eng.Calls()[before:]
			want := GateKey{Engine: "engine-a", Image: image, Runtime: sandbox.RuntimeRunc}
			if !slices.Equal(checked, []GateKey{want}) {
				t.Errorf("checked keys %+v, want one check of %+v", checked, want)
			}
			if c.fail != nil {
				if !errors.Is(err, c.fail) {
					t.Errorf("run: got error %v, want the check's %v", err, c.fail)
				}
				if !errors.Is(g.Precheck(context.Background(), job), c.fail) {
					t.Error("precheck of the failed key passed")
				}
			} else if err != nil || res.Status != sandbox.StatusSucceeded {
				t.Errorf("run: got %s, %v; want succeeded", res.Status, err)
			}
			if got := len(calls) > 0; got != c.wantCalls {
				t.Errorf("engine calls during the run: %v; want some: %v", calls, c.wantCalls)
			}
		})
	}
}
