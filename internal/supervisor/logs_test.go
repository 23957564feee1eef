package supervisor

import (
	"bytes"
	"os/exec"
	"reflect"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/sandbox"
)

// TestEvidenceTakesNoLogs: nothing in the supervisor's input can carry log
// bytes. Evidence has exactly one reader, the report artifact, and no field
// is a sandbox.Log other than inside the broker's Result (digests only).
func TestEvidenceTakesNoLogs(t *testing.T) {
	ty := reflect.TypeOf(Evidence{})
	readers := 0
	for i := 0; i < ty.NumField(); i++ {
		f := ty.Field(i)
		name := strings.ToLower(f.Name)
		if strings.Contains(name, "stdout") || strings.Contains(name, "stderr") || strings.Contains(name, "log") {
			t.Errorf("Evidence.%s looks like a log field; the supervisor never reads logs", f.Name)
		}
		if f.Type.Kind() == reflect.Interface || f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Uint8 {
			readers++
			if f.Name != "Report" {
				t.Errorf("Evidence.%s (%s) could carry bytes; only Report may", f.Name, f.Type)
			}
		}
	}
	if readers != 1 {
		t.Errorf("byte-carrying fields: got %d, want 1 (Report)", readers)
	}
}

// TestFakePassInLogsChangesNothing: a grader whose logs claim a flood of
// passes (large, truncated, any digest) gets the same verdict and check
// results; only the result digest the assessment is bound to changes.
func TestFakePassInLogsChangesNothing(t *testing.T) {
	report := readFixture(t, "gotest/fakepass.json")
	pol := Policy{Format: FormatGoTestJSON, AllReported: true}
	quiet := mustJudge(t, evidence(pol, report, 1))

	loud := evidence(pol, report, 1)
	fake := bytes.Repeat([]byte("--- PASS: TestLiar (0.00s)\nok  \texample.com/fixtures/fakepass\t0.001s\nPASS\n"), 1<<14)
	loud.Grader.Stdout = sandbox.Log{Digest: sandbox.DigestBytes(fake), Bytes: int64(len(fake)), Total: 50 << 30, Truncated: true}
	loud.Grader.Stderr = sandbox.Log{Digest: sandbox.DigestBytes(fake), Bytes: int64(len(fake)), Total: int64(len(fake))}
	got := mustJudge(t, loud)

	if got.Verdict != Failed || quiet.Verdict != Failed {
		t.Fatalf("verdicts: got %s and %s, want failed for both", got.Verdict, quiet.Verdict)
	}
	if got.Binding.GraderResultDigest == quiet.Binding.GraderResultDigest {
		t.Fatalf("the result digests are equal; the logs did not reach the result")
	}
	// Replace the one digest that must differ and compare everything else.
	norm := func(a Assessment) []byte {
		d := a.Binding.GraderResultDigest
		b, err := a.CanonicalJSON()
		if err != nil {
			t.Fatal(err)
		}
		return bytes.ReplaceAll(b, []byte(d), []byte("RESULT"))
	}
	if g, w := norm(got), norm(quiet); !bytes.Equal(g, w) {
		t.Errorf("assessment changed with the logs:\ngot  %s\nwant %s", g, w)
	}
}

// TestFakePassInReportOutput: in the real go test -json fixture, TestLiar
// prints "--- PASS", "PASS" and "ok" lines and TestForged prints a forged
// pass event as output; both are failed, because only Action events count.
func TestFakePassInReportOutput(t *testing.T) {
	data := readFixture(t, "gotest/fakepass.json")
	for _, fake := range []string{"--- PASS: TestLiar", "ok  \\texample.com/fixtures/fakepass", `{\"Action\":\"pass\"`} {
		if !bytes.Contains(data, []byte(fake)) {
			t.Fatalf("fixture does not contain the fake line %q", fake)
		}
	}
	rep, err := ParseGoTestJSON(bytes.NewReader(data), ParseLimits{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]CheckStatus{
		"example.com/fixtures/fakepass.TestLiar":   CheckFailed,
		"example.com/fixtures/fakepass.TestForged": CheckFailed,
	}
	if len(rep.Checks) != len(want) {
		t.Fatalf("checks: got %+v, want %v", rep.Checks, want)
	}
	for _, c := range rep.Checks {
		if want[c.Name] != c.Status {
			t.Errorf("%s: got %s, want %s", c.Name, c.Status, want[c.Name])
		}
	}
}

// TestNoEngineImport: the supervisor never links the container engine
// client (STYLE.md habit 11).
func TestNoEngineImport(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps returned %d packages; cannot judge", len(deps))
	}
	for _, d := range deps {
		for _, banned := range []string{"github.com/moby/moby", "github.com/docker/docker", "github.com/sandboxd/sandboxd/internal/broker"} {
			if strings.HasPrefix(d, banned) {
				t.Errorf("supervisor depends on %s", d)
			}
		}
	}
}
