package integration

import (
	"os"
	"testing"

	"github.com/sandboxd/sandboxd/internal/testharness"
	"github.com/sandboxd/sandboxd/sandbox"
)

var env *testharness.Env

func TestMain(m *testing.M) { os.Exit(testharness.Main(m, &env)) }

// Short names for the shared helpers.
func newJob(t *testing.T, argv []string, mod func(*sandbox.Job)) sandbox.Job {
	t.Helper()
	return env.NewJob(t, argv, mod)
}

func sh(script string) []string { return testharness.Sh(script) }

func runJob(t *testing.T, j sandbox.Job) sandbox.Result {
	t.Helper()
	return env.Run(t, nil, j)
}

func assertGone(t *testing.T, j sandbox.Job)               { t.Helper(); env.AssertGone(t, j) }
func readBlob(t *testing.T, d string) []byte               { t.Helper(); return env.Blob(t, d) }
func stdout(t *testing.T, r sandbox.Result) string         { t.Helper(); return env.Stdout(t, r) }
func stderr(t *testing.T, r sandbox.Result) string         { t.Helper(); return env.Stderr(t, r) }
func putTree(t *testing.T, files map[string]string) string { t.Helper(); return env.PutTree(t, files) }
