package bundle

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/sandbox"
)

// ManifestSchema is the only bundle.json schema version this release reads.
const ManifestSchema = "sandboxd.bundle/v1"

// ManifestFile is the name of a bundle's manifest at the root of its tree.
const ManifestFile = "bundle.json"

// maxManifestBytes bounds bundle.json.
const maxManifestBytes = 1 << 20

// Report formats a grader may write.
const (
	FormatGoTestJSON       = "go-test-json"
	FormatJUnitXML         = "junit-xml"
	FormatTAP              = "tap"
	FormatInTotoTestResult = "in-toto-test-result"
)

// Manifest is bundle.json: what an evaluator bundle is and how it judges.
// It is decoded strictly (unknown fields refused) and every error names the
// field, e.g. `bundle.json: grader.argv: empty`. BUNDLE.md documents it for
// bundle authors.
type Manifest struct {
	// SchemaVersion must be ManifestSchema.
	SchemaVersion string `json:"schema_version"`
	// Instance, if set, names the one task instance the bundle evaluates
	// (a SWE-bench-style id, e.g. "astropy__astropy-12907"): a valid
	// sandbox.ValidInstance id. It is carried into the assessment's
	// binding and the signed test-result statement, so a verdict says
	// which instance it is about in words as well as by bundle digest.
	Instance string `json:"instance,omitempty"`
	// Image is the evaluator image, by local image ID ("sha256:<64 hex>");
	// tags and names are refused.
	Image string `json:"image"`
	// Grader is the command the grader job runs.
	Grader Command `json:"grader"`
	// Report says where the grader leaves its structured report.
	Report Report `json:"report"`
	// RequiredChecks are the check names that must each appear exactly once
	// in the report and pass. Exactly one of RequiredChecks (non-empty) and
	// AllReported (true) is set.
	RequiredChecks []string `json:"required_checks,omitempty"`
	// AllReported requires every check the report lists to pass (and at
	// least one to be listed) instead of a fixed list.
	AllReported bool `json:"all_reported,omitempty"`
	// DefaultLimits are the limits of the bundle's jobs unless a caller
	// tightens them; every field is required (sandbox.Limits.Validate).
	DefaultLimits sandbox.Limits `json:"default_limits"`
	// Candidate, if set, is the command a candidate job runs on the
	// workspace before grading.
	Candidate *Command `json:"candidate,omitempty"`
	// Controls, if set, name control workspaces inside the bundle.
	Controls *Controls `json:"controls,omitempty"`
	// Workspace, if set, are the workspace rules (rules.go): paths the
	// bundle refuses in a candidate's workspace.
	Workspace *WorkspaceRules `json:"workspace,omitempty"`
}

// Command is a command run directly, without a shell.
type Command struct {
	// Argv is the command and its arguments; Argv[0] is not empty.
	Argv []string `json:"argv"`
}

// Report is the grader's structured report.
type Report struct {
	// Format is one of FormatGoTestJSON, FormatJUnitXML, FormatTAP,
	// FormatInTotoTestResult.
	Format string `json:"format"`
	// Path is the report's absolute path in the sandbox, below
	// sandbox.WorkPath or sandbox.TmpPath.
	Path string `json:"path"`
}

// Controls are workspaces whose verdicts are known in advance, to prove the
// grader's detection power: known-good must pass and known-bad must fail.
// Each is a directory of the bundle tree, relative to its root; at least
// one is set.
type Controls struct {
	KnownGood string `json:"known_good,omitempty"`
	KnownBad  string `json:"known_bad,omitempty"`
}

const (
	maxArgs      = 4096
	maxArgBytes  = 128 * 1024
	maxChecks    = 10_000
	maxCheckName = 1024
)

// DecodeManifest strictly decodes and validates bundle.json.
func DecodeManifest(data []byte) (Manifest, error) {
	if len(data) > maxManifestBytes {
		return Manifest{}, manifestErr("", "%d bytes (at most %d)", len(data), maxManifestBytes)
	}
	if !utf8.Valid(data) {
		return Manifest{}, manifestErr("", "not valid UTF-8")
	}
	if err := checkKeys(data); err != nil {
		var fe *sandbox.FieldError
		if errors.As(err, &fe) {
			return Manifest{}, err
		}
		return Manifest{}, manifestErr("", "%v", err)
	}
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return Manifest{}, manifestErr(te.Field, "want %s, got JSON %s", te.Type, te.Value)
		}
		return Manifest{}, manifestErr("", "%v", err)
	}
	if dec.More() {
		return Manifest{}, manifestErr("", "trailing data after the JSON object")
	}
	if _, err := dec.Token(); err == nil {
		return Manifest{}, manifestErr("", "trailing data after the JSON object")
	}
	if err := m.Validate(); err != nil {
		return Manifest{}, err
	}
	// "instance": "" decodes as no instance: refused, since it is most
	// likely a template left unfilled.
	var given struct {
		Instance *string `json:"instance"`
	}
	if err := json.Unmarshal(data, &given); err == nil && given.Instance != nil && *given.Instance == "" {
		return Manifest{}, manifestErr("instance", "empty (omit the field for a bundle of no instance)")
	}
	return m, nil
}

// manifestErr is a *sandbox.FieldError (so it matches sandbox.ErrInvalid)
// inside a "bundle.json: " prefix.
func manifestErr(field, format string, args ...any) error {
	if field == "" {
		return fmt.Errorf("%s: %w", ManifestFile, &sandbox.FieldError{Field: "(document)", Reason: fmt.Sprintf(format, args...)})
	}
	return fmt.Errorf("%s: %w", ManifestFile, &sandbox.FieldError{Field: field, Reason: fmt.Sprintf(format, args...)})
}

// Validate checks every field; the error names the first one that is wrong.
func (m *Manifest) Validate() error {
	if m.SchemaVersion != ManifestSchema {
		return manifestErr("schema_version", "unknown schema %q (want %q)", m.SchemaVersion, ManifestSchema)
	}
	if m.Instance != "" {
		if err := checkInstance(m.Instance); err != nil {
			return err
		}
	}
	if !sandbox.ValidDigest(m.Image) {
		return fmt.Errorf("%w: %w", manifestErr("image", "%q is not a local image ID (sha256:<64 hex>); tags and names are refused", m.Image), sandbox.ErrImageRefused)
	}
	if err := checkArgv("grader.argv", m.Grader.Argv); err != nil {
		return err
	}
	switch m.Report.Format {
	case FormatGoTestJSON, FormatJUnitXML, FormatTAP, FormatInTotoTestResult:
	default:
		return manifestErr("report.format", "%q is not one of %s, %s, %s, %s", m.Report.Format,
			FormatGoTestJSON, FormatJUnitXML, FormatTAP, FormatInTotoTestResult)
	}
	if err := checkReportPath(m.Report.Path); err != nil {
		return err
	}
	switch {
	case len(m.RequiredChecks) > 0 && m.AllReported:
		return manifestErr("required_checks", "set together with all_reported (exactly one of the two)")
	case len(m.RequiredChecks) == 0 && !m.AllReported:
		return manifestErr("required_checks", "empty and all_reported is not true (exactly one of the two)")
	}
	if len(m.RequiredChecks) > maxChecks {
		return manifestErr("required_checks", "%d checks (at most %d)", len(m.RequiredChecks), maxChecks)
	}
	seen := map[string]bool{}
	for i, c := range m.RequiredChecks {
		f := fmt.Sprintf("required_checks[%d]", i)
		if c == "" || len(c) > maxCheckName || hasControl(c) {
			return manifestErr(f, "%q is empty, longer than %d bytes or has control characters", c, maxCheckName)
		}
		if seen[c] {
			return manifestErr(f, "duplicate check %q", c)
		}
		seen[c] = true
	}
	if err := m.DefaultLimits.Validate("default_limits"); err != nil {
		return fmt.Errorf("%s: %w", ManifestFile, err)
	}
	if m.Candidate != nil {
		if err := checkArgv("candidate.argv", m.Candidate.Argv); err != nil {
			return err
		}
	}
	if c := m.Controls; c != nil {
		if c.KnownGood == "" && c.KnownBad == "" {
			return manifestErr("controls", "neither known_good nor known_bad is set")
		}
		if err := checkControl("controls.known_good", c.KnownGood); err != nil {
			return err
		}
		if err := checkControl("controls.known_bad", c.KnownBad); err != nil {
			return err
		}
		if c.KnownGood != "" && c.KnownGood == c.KnownBad {
			return manifestErr("controls.known_bad", "same directory as known_good")
		}
	}
	if m.Workspace != nil {
		if err := m.Workspace.validate(); err != nil {
			return err
		}
	}
	return nil
}

// ControlDirs returns the control directories the manifest names.
func (m *Manifest) ControlDirs() []string {
	var out []string
	if m.Controls != nil {
		for _, d := range []string{m.Controls.KnownGood, m.Controls.KnownBad} {
			if d != "" {
				out = append(out, d)
			}
		}
	}
	return out
}

func checkArgv(field string, argv []string) error {
	if len(argv) == 0 || argv[0] == "" {
		return manifestErr(field, "empty")
	}
	if len(argv) > maxArgs {
		return manifestErr(field, "%d arguments (at most %d)", len(argv), maxArgs)
	}
	total := 0
	for i, a := range argv {
		total += len(a)
		if strings.IndexByte(a, 0) >= 0 {
			return manifestErr(fmt.Sprintf("%s[%d]", field, i), "contains NUL")
		}
	}
	if total > maxArgBytes {
		return manifestErr(field, "%d bytes (at most %d)", total, maxArgBytes)
	}
	return nil
}

func checkInstance(id string) error {
	if len(id) > sandbox.MaxInstanceBytes {
		return manifestErr("instance", "%d bytes (at most %d)", len(id), sandbox.MaxInstanceBytes)
	}
	if !sandbox.ValidInstance(id) {
		return manifestErr("instance", "%q is not an instance id: ASCII letters, digits, '.', '_' and '-', starting with a letter or digit", id)
	}
	return nil
}

func checkReportPath(p string) error {
	const f = "report.path"
	if p == "" || !path.IsAbs(p) || path.Clean(p) != p || len(p) > 1024 || hasControl(p) {
		return manifestErr(f, "%q is not a clean absolute path", p)
	}
	for _, dir := range []string{sandbox.WorkPath, sandbox.TmpPath} {
		if strings.HasPrefix(p, dir+"/") {
			return nil
		}
	}
	return manifestErr(f, "%q is not below %s or %s", p, sandbox.WorkPath, sandbox.TmpPath)
}

func checkControl(field, dir string) error {
	if dir == "" {
		return nil
	}
	if err := checkName(dir, DefaultLimits()); err != nil {
		return manifestErr(field, "%v", err)
	}
	if dir == ManifestFile {
		return manifestErr(field, "names %s", ManifestFile)
	}
	return nil
}

func hasControl(s string) bool {
	for _, r := range s {
		if r < 0x20 || (r >= 0x7f && r < 0xa0) {
			return true
		}
	}
	return false
}
