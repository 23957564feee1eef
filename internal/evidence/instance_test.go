package evidence

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/supervisor"
	"github.com/sandboxd/sandboxd/sandbox"
)

const testInstance = "astropy__astropy-12907"

// withInstance names an instance in the fixture's bundle.json.
func withInstance(id string) func([]byte) []byte {
	return func(m []byte) []byte {
		return bytes.Replace(m, []byte(`"schema_version": "sandboxd.bundle/v1",`), []byte(`"schema_version": "sandboxd.bundle/v1", "instance": "`+id+`",`), 1)
	}
}

// The evidence of a bundle naming an instance carries it in the
// assessment's binding and the signed statement, and reproduces.
func TestEvidenceNamesTheInstance(t *testing.T) {
	f := newFixture(t, withInstance(testInstance))
	if f.bundle.Manifest.Instance != testInstance {
		t.Fatalf("bundle instance %q, want %q", f.bundle.Manifest.Instance, testInstance)
	}
	dir, o := f.run(t, "run-a", f.workspace(t, "package add\n"))
	if o.Assessment.Binding.Instance != testInstance {
		t.Errorf("binding instance %q, want %q", o.Assessment.Binding.Instance, testInstance)
	}
	tr, err := sandbox.VerifyTestResult(f.keys, o.Statement)
	if err != nil || tr.Instance != testInstance {
		t.Fatalf("signed statement: instance %q, %v; want %q", tr.Instance, err, testInstance)
	}
	for _, c := range o.Controls {
		if c.Assessment.Binding.Instance != testInstance {
			t.Errorf("control %s: binding instance %q, want %q", c.Kind, c.Assessment.Binding.Instance, testInstance)
		}
	}
	rep := f.check(t, dir)
	if len(rep.Problems) > 0 || !rep.Recomputed || rep.Verdict != supervisor.Passed {
		t.Fatalf("check: verdict %s, problems %q", rep.Verdict, rep.Problems)
	}
}

// The checker refuses a signed statement or an assessment whose instance
// is not the bundle's, however well signed: another instance, none where
// the bundle names one, one where it names none.
func TestCheckRefusesAnotherInstance(t *testing.T) {
	// resign re-signs the statement with its bundle entry's annotations
	// replaced (removed when nil), as a holder of the key could.
	resign := func(t *testing.T, f *fixture, dir string, annotations map[string]any) {
		t.Helper()
		env, err := os.ReadFile(filepath.Join(dir, "test-result.intoto.json"))
		if err != nil {
			t.Fatal(err)
		}
		ve, err := sandbox.VerifyEnvelope(f.keys, env)
		if err != nil {
			t.Fatal(err)
		}
		var st supervisor.TestResultStatement
		if err := json.Unmarshal(ve.Payload, &st); err != nil {
			t.Fatal(err)
		}
		st.Predicate.Configuration[0].Annotations = annotations
		payload, err := sandbox.CanonicalJSON(st)
		if err != nil {
			t.Fatal(err)
		}
		if env, err = f.signer.SignPayload(payload); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "test-result.intoto.json"), env, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	named := newFixture(t, withInstance(testInstance))
	plain := newFixture(t)
	for name, tc := range map[string]struct {
		f      *fixture
		tamper func(t *testing.T, f *fixture, dir string)
		want   string
	}{
		"another instance in the statement": {
			f: named,
			tamper: func(t *testing.T, f *fixture, dir string) {
				resign(t, f, dir, map[string]any{"instance": "astropy__astropy-13033"})
			},
			want: `test-result.intoto.json: predicate.configuration[0].annotations.instance: the evidence says "astropy__astropy-13033", recomputed "astropy__astropy-12907"`,
		},
		"no instance in the statement": {
			f:      named,
			tamper: func(t *testing.T, f *fixture, dir string) { resign(t, f, dir, nil) },
			want:   `test-result.intoto.json: predicate.configuration[0].annotations: missing from the evidence, recomputed {"instance":"astropy__astropy-12907"}`,
		},
		"an instance the bundle does not name": {
			f: plain,
			tamper: func(t *testing.T, f *fixture, dir string) {
				resign(t, f, dir, map[string]any{"instance": testInstance})
			},
			want: `test-result.intoto.json: predicate.configuration[0].annotations: in the evidence ({"instance":"astropy__astropy-12907"}), not recomputed`,
		},
		"another instance in assessment.json": {
			f: named,
			tamper: func(t *testing.T, f *fixture, dir string) {
				edit(t, filepath.Join(dir, "assessment.json"), func(b []byte) []byte {
					return bytes.Replace(b, []byte(`"instance":"`+testInstance+`"`), []byte(`"instance":"astropy__astropy-13033"`), 1)
				})
			},
			want: `assessment.json: binding.instance: the evidence says "astropy__astropy-13033", recomputed "astropy__astropy-12907"`,
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir, _ := tc.f.run(t, "run-a", tc.f.workspace(t, "package add\n"))
			tc.tamper(t, tc.f, dir)
			rep := tc.f.check(t, dir)
			found := false
			for _, p := range rep.Problems {
				found = found || strings.HasPrefix(p, tc.want)
			}
			if !found {
				t.Errorf("problems %q; want one starting %q", rep.Problems, tc.want)
			}
		})
	}
}
