package bundle

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/sandbox"
)

func exampleManifest(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "example-bundle", ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// edit decodes doc, applies fn to the generic object and encodes it again.
func edit(t *testing.T, doc []byte, fn func(m map[string]any)) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(doc, &m); err != nil {
		t.Fatal(err)
	}
	fn(m)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeManifest(t *testing.T) {
	valid := exampleManifest(t)
	m, err := DecodeManifest(valid)
	if err != nil {
		t.Fatalf("example: %v", err)
	}
	if got := strings.Join(m.Grader.Argv, " "); got != "/bundle/grader/run.sh /inputs/candidate-export" {
		t.Errorf("grader.argv: got %q", got)
	}
	if got := m.ControlDirs(); len(got) != 2 || got[0] != "controls/good" || got[1] != "controls/bad" {
		t.Errorf("ControlDirs: got %q, want [controls/good controls/bad]", got)
	}
	if m.DefaultLimits != sandbox.DefaultLimits() {
		t.Errorf("default_limits: got %+v, want %+v", m.DefaultLimits, sandbox.DefaultLimits())
	}

	set := func(key string, v any) func(map[string]any) {
		return func(m map[string]any) {
			parts := strings.Split(key, ".")
			obj := m
			for _, p := range parts[:len(parts)-1] {
				obj = obj[p].(map[string]any)
			}
			if v == nil {
				delete(obj, parts[len(parts)-1])
			} else {
				obj[parts[len(parts)-1]] = v
			}
		}
	}
	cases := []struct {
		name string
		doc  []byte
		want string // the error's prefix
	}{
		{"unknown field", edit(t, valid, set("extra", 1)), `bundle.json: (document): json: unknown field "extra"`},
		{"unknown nested field", edit(t, valid, set("grader.shell", true)), `bundle.json: (document): json: unknown field "shell"`},
		{"schema version", edit(t, valid, set("schema_version", "sandboxd.bundle/v2")), "bundle.json: schema_version: unknown schema"},
		{"missing schema", edit(t, valid, set("schema_version", nil)), "bundle.json: schema_version: unknown schema"},
		{"image tag", edit(t, valid, set("image", "golang:1.22")), "bundle.json: image: "},
		{"image upper hex", edit(t, valid, set("image", "sha256:"+strings.Repeat("A", 64))), "bundle.json: image: "},
		{"empty grader argv", edit(t, valid, set("grader.argv", []any{})), "bundle.json: grader.argv: empty"},
		{"grader argv0 empty", edit(t, valid, set("grader.argv", []any{""})), "bundle.json: grader.argv: empty"},
		{"grader argv NUL", edit(t, valid, set("grader.argv", []any{"a", "b\x00"})), "bundle.json: grader.argv[1]: contains NUL"},
		{"grader argv type", edit(t, valid, set("grader.argv", "run.sh")), "bundle.json: grader.argv: want []string"},
		{"report format", edit(t, valid, set("report.format", "xunit")), "bundle.json: report.format: "},
		{"report relative", edit(t, valid, set("report.path", "report.json")), "bundle.json: report.path: "},
		{"report in bundle", edit(t, valid, set("report.path", "/bundle/report.json")), "bundle.json: report.path: "},
		{"report is /work", edit(t, valid, set("report.path", "/work")), "bundle.json: report.path: "},
		{"report unclean", edit(t, valid, set("report.path", "/work/../etc/x")), "bundle.json: report.path: "},
		{"both checks and all", edit(t, valid, set("all_reported", true)), "bundle.json: required_checks: set together with all_reported"},
		{"neither", edit(t, valid, set("required_checks", nil)), "bundle.json: required_checks: empty and all_reported"},
		{"duplicate check", edit(t, valid, set("required_checks", []any{"A", "A"})), "bundle.json: required_checks[1]: duplicate"},
		{"empty check", edit(t, valid, set("required_checks", []any{""})), "bundle.json: required_checks[0]: "},
		{"limit out of range", edit(t, valid, set("default_limits.pids", 1)), "bundle.json: default_limits.pids: 1 is out of range"},
		{"limit missing", edit(t, valid, set("default_limits.wall_time_ms", nil)), "bundle.json: default_limits.wall_time_ms: 0 is out of range"},
		{"candidate empty", edit(t, valid, set("candidate.argv", []any{})), "bundle.json: candidate.argv: empty"},
		{"controls empty", edit(t, valid, set("controls", map[string]any{})), "bundle.json: controls: neither"},
		{"control escapes", edit(t, valid, set("controls.known_bad", "../x")), "bundle.json: controls.known_bad: "},
		{"control absolute", edit(t, valid, set("controls.known_good", "/x")), "bundle.json: controls.known_good: "},
		{"controls equal", edit(t, valid, set("controls.known_bad", "controls/good")), "bundle.json: controls.known_bad: same directory"},
		{"instance with a slash", edit(t, valid, set("instance", "django/django#123")), `bundle.json: instance: "django/django#123" is not an instance id: ASCII letters, digits, '.', '_' and '-', starting with a letter or digit`},
		{"instance with a space", edit(t, valid, set("instance", "astropy 12907")), `bundle.json: instance: "astropy 12907" is not an instance id`},
		{"instance leading dash", edit(t, valid, set("instance", "-x")), `bundle.json: instance: "-x" is not an instance id`},
		{"instance leading dot", edit(t, valid, set("instance", "..")), `bundle.json: instance: ".." is not an instance id`},
		{"instance newline", edit(t, valid, set("instance", "a\nb")), `bundle.json: instance: "a\nb" is not an instance id`},
		{"instance not ASCII", edit(t, valid, set("instance", "astropy\u2011astropy")), "bundle.json: instance: \"astropy\u2011astropy\" is not an instance id"},
		{"instance too long", edit(t, valid, set("instance", strings.Repeat("a", 129))), "bundle.json: instance: 129 bytes (at most 128)"},
		{"instance empty", edit(t, valid, set("instance", "")), "bundle.json: instance: empty (omit the field for a bundle of no instance)"},
		{"instance a number", edit(t, valid, set("instance", 12907)), "bundle.json: instance: want string, got JSON number"},
		{"duplicate key", []byte(strings.Replace(string(valid), `"image":`, `"image": "x", "image":`, 1)), "bundle.json: image: given twice"},
		{"case variant key", []byte(strings.Replace(string(valid), `"image":`, `"Image":`, 1)), "bundle.json: Image: unknown field"},
		{"trailing data", append(append([]byte{}, valid...), []byte(" {}")...), "bundle.json: (document): trailing data"},
		{"not an object", []byte(`[]`), "bundle.json: (document): "},
		{"invalid UTF-8", []byte("{\"schema_version\": \"\xff\"}"), "bundle.json: (document): not valid UTF-8"},
		{"too deep", []byte(strings.Repeat("[", 40) + strings.Repeat("]", 40)), "bundle.json: "},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeManifest(tc.doc)
			if err == nil {
				t.Fatalf("got nil, want an error starting %q", tc.want)
			}
			if !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("got %q, want it to start with %q", err, tc.want)
			}
			if !errors.Is(err, sandbox.ErrInvalid) {
				t.Errorf("got %v, want it to match sandbox.ErrInvalid", err)
			}
		})
	}
	t.Run("all_reported alone", func(t *testing.T) {
		doc := edit(t, valid, func(m map[string]any) { delete(m, "required_checks"); m["all_reported"] = true })
		if _, err := DecodeManifest(doc); err != nil {
			t.Errorf("got %v, want success", err)
		}
	})
	t.Run("instance ids", func(t *testing.T) {
		for _, id := range []string{
			"astropy__astropy-12907", "django__django-11099", "scikit-learn__scikit-learn-25500",
			"Automattic__wp-calypso-21648", "oauthlib__oauthlib.1fd52536.combine_file__09vlzwgc",
			"shop-bulk-threshold-1", "7", strings.Repeat("a", 128),
		} {
			m, err := DecodeManifest(edit(t, valid, set("instance", id)))
			if err != nil || m.Instance != id {
				t.Errorf("%q: got %q, %v; want it accepted", id, m.Instance, err)
			}
		}
		if m, err := DecodeManifest(valid); err != nil || m.Instance != "" {
			t.Errorf("no instance: got %q, %v; want none", m.Instance, err)
		}
	})
	t.Run("image tag is ErrImageRefused", func(t *testing.T) {
		_, err := DecodeManifest(edit(t, valid, set("image", "busybox:latest")))
		if !errors.Is(err, sandbox.ErrImageRefused) {
			t.Errorf("got %v, want sandbox.ErrImageRefused", err)
		}
	})
}
