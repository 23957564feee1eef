package archtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v2"
)

// actionlint is the pinned linter of the GitHub Actions example, run from
// the Go module proxy so that the example cannot rot unnoticed.
const actionlint = "github.com/rhysd/actionlint/cmd/actionlint@v1.7.12"

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func runActionlint(t *testing.T, files ...string) (string, error) {
	t.Helper()
	args := append([]string{"run", actionlint, "-no-color"}, files...)
	cmd := exec.Command("go", args...)
	cmd.Dir = repoRoot(t)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// The GitHub Actions example passes actionlint (which also runs
// shellcheck on its scripts when shellcheck is installed, as scripts/setup
// does). Never skipped: go run fetches the pinned version.
func TestGitHubWorkflowPassesActionlint(t *testing.T) {
	if out, err := runActionlint(t, filepath.Join("examples", "ci", "github-actions.yml")); err != nil {
		t.Fatalf("actionlint examples/ci/github-actions.yml: %v\n%s", err, out)
	}
}

// The check can fail: a workflow with an unknown runner key and a
// reference to an undefined step output is refused.
func TestActionlintCatchesAMistake(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "examples", "ci", "github-actions.yml"))
	if err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(string(b), "steps.evaluate.outputs.code", "steps.evaluat.outputs.code", 1)
	if bad == string(b) {
		t.Fatal("the workflow no longer reads steps.evaluate.outputs.code")
	}
	path := filepath.Join(t.TempDir(), "bad.yml")
	if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runActionlint(t, path)
	if err == nil || !strings.Contains(out, "evaluat") {
		t.Fatalf("actionlint accepted a reference to an undefined step (err %v):\n%s", err, out)
	}
}

// The GitLab example parses as YAML and has what docs/ci.md promises: the
// evaluation writes the evidence and the JUnit file, both are artifacts
// even when the job fails, the JUnit file is the test report, and only
// an infrastructure failure (exit 4) is retried.
func TestGitLabJobParses(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "examples", "ci", "gitlab-ci.yml"))
	if err != nil {
		t.Fatal(err)
	}
	// Strict: a key this test does not know (a typo) is an error.
	var doc struct {
		Stages []string `yaml:"stages"`
		Job    struct {
			Stage     string            `yaml:"stage"`
			Tags      []string          `yaml:"tags"`
			Variables map[string]string `yaml:"variables"`
			Script    []string          `yaml:"script"`
			Artifacts struct {
				When    string   `yaml:"when"`
				Paths   []string `yaml:"paths"`
				Reports struct {
					JUnit string `yaml:"junit"`
				} `yaml:"reports"`
			} `yaml:"artifacts"`
			Retry struct {
				Max       int    `yaml:"max"`
				When      string `yaml:"when"`
				ExitCodes int    `yaml:"exit_codes"`
			} `yaml:"retry"`
		} `yaml:"sandboxd-evaluate"`
	}
	if err := yaml.UnmarshalStrict(b, &doc); err != nil {
		t.Fatalf("examples/ci/gitlab-ci.yml: %v", err)
	}
	job := doc.Job
	if len(job.Script) == 0 || job.Stage != "evaluate" || strings.Join(doc.Stages, " ") != "evaluate" {
		t.Fatalf("no sandboxd-evaluate job in stage evaluate: %+v", doc)
	}
	script := strings.Join(job.Script, "\n")
	for _, want := range []string{"--junit junit.xml", "--out evidence", `exit "$code"`} {
		if !strings.Contains(script, want) {
			t.Errorf("the job's script lacks %q", want)
		}
	}
	if job.Artifacts.When != "always" || job.Artifacts.Reports.JUnit != "junit.xml" ||
		strings.Join(job.Artifacts.Paths, " ") != "evidence/ junit.xml" {
		t.Errorf("artifacts %+v: want evidence/ and junit.xml, always, junit.xml as the report", job.Artifacts)
	}
	if job.Retry.ExitCodes != 4 || job.Retry.When != "script_failure" {
		t.Errorf("retry %+v: want only exit 4 (infrastructure) retried", job.Retry)
	}
}
