package bundle

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Each repository example's bundle.json (rendered from bundle.json.in)
// names the instance its instance.json is about, and requires exactly the
// tests instance.json lists: the grader reads one, the signed statement
// carries the other, and they must not drift apart.
func TestRepoExamplesNameTheirInstance(t *testing.T) {
	for _, ex := range []struct{ dir, image string }{{"repo-python", "@PYTHON_IMAGE@"}, {"repo-go", "@GO_IMAGE@"}} {
		t.Run(ex.dir, func(t *testing.T) {
			root := filepath.Join("..", "..", "examples", ex.dir)
			tmpl, err := os.ReadFile(filepath.Join(root, "bundle.json.in"))
			if err != nil {
				t.Fatal(err)
			}
			m, err := DecodeManifest(bytes.Replace(tmpl, []byte(ex.image), []byte("sha256:"+strings.Repeat("0", 64)), 1))
			if err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(filepath.Join(root, "bundle", "instance.json"))
			if err != nil {
				t.Fatal(err)
			}
			var inst struct {
				ID         string   `json:"instance_id"`
				FailToPass []string `json:"FAIL_TO_PASS"`
				PassToPass []string `json:"PASS_TO_PASS"`
			}
			if err := json.Unmarshal(b, &inst); err != nil {
				t.Fatal(err)
			}
			if m.Instance == "" || m.Instance != inst.ID {
				t.Errorf("bundle.json.in: instance %q, instance.json: instance_id %q; want the same", m.Instance, inst.ID)
			}
			want := slices.Sorted(slices.Values(append(append([]string{}, inst.FailToPass...), inst.PassToPass...)))
			if got := slices.Sorted(slices.Values(m.RequiredChecks)); !slices.Equal(got, want) {
				t.Errorf("bundle.json.in: required_checks %q, want FAIL_TO_PASS + PASS_TO_PASS %q", got, want)
			}
		})
	}
}
