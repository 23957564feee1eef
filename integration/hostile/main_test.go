package hostile

import (
	"encoding/json"
	"os"
	"sync"
	"testing"

	"github.com/sandboxd/sandboxd/internal/testharness"
	"github.com/sandboxd/sandboxd/sandbox"
)

var env *testharness.Env

func TestMain(m *testing.M) { os.Exit(testharness.Main(m, &env)) }

// probePath is where jobs that need the probe see it.
const probePath = "/inputs/probe/sandboxd-probe"

var probeOnce struct {
	sync.Once
	digest string
	err    error
}

// probeInput returns the probe the harness built as a read-only input at
// /inputs/probe.
func probeInput(t *testing.T) sandbox.Input {
	t.Helper()
	probeOnce.Do(func() {
		var b []byte
		if b, probeOnce.err = os.ReadFile(env.Probe); probeOnce.err != nil {
			return
		}
		probeOnce.digest = env.PutTree(t, map[string]string{"sandboxd-probe*": string(b)})
	})
	if probeOnce.err != nil {
		t.Fatal(probeOnce.err)
	}
	return sandbox.Input{Name: "probe", Digest: probeOnce.digest, Path: "/inputs/probe"}
}

// withProbe adds the probe input to a job.
func withProbe(t *testing.T) func(*sandbox.Job) {
	in := probeInput(t)
	return func(j *sandbox.Job) { j.Inputs = append(j.Inputs, in) }
}

// decode parses a job's stdout as JSON into v.
func decode(t *testing.T, r sandbox.Result, v any) {
	t.Helper()
	out := env.Stdout(t, r)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("stdout is not the probe's JSON: %v\nstdout: %q\nstderr: %q", err, out, env.Stderr(t, r))
	}
}
