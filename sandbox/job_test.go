package sandbox

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func validJob() Job {
	return Job{
		Schema: JobSchema, ID: "job-1", Image: "sha256:" + strings.Repeat("a", 64),
		Inputs: []Input{
			{Name: "bundle", Digest: "sha256:" + strings.Repeat("b", 64), Path: BundlePath},
			{Name: "workspace", Digest: "sha256:" + strings.Repeat("c", 64), Path: WorkPath, Writable: true},
		},
		Argv: []string{"go", "test", "./..."}, Env: map[string]string{"GOFLAGS": "-count=1"},
		WorkDir: WorkPath, Outputs: []string{"/work/out"}, Limits: DefaultLimits(),
		Network: NetworkNone, Runtime: RuntimeRunc,
	}
}

func TestJobValidateNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mod   func(*Job)
		field string
	}{
		{"schema", func(j *Job) { j.Schema = "sandboxd.job/v2" }, "job.schema"},
		{"id empty", func(j *Job) { j.ID = "" }, "job.id"},
		{"id slash", func(j *Job) { j.ID = "a/b" }, "job.id"},
		{"image tag", func(j *Job) { j.Image = "busybox:latest" }, "job.image"},
		{"image upper hex", func(j *Job) { j.Image = "sha256:" + strings.Repeat("A", 64) }, "job.image"},
		{"bundle digest", func(j *Job) { j.Bundle = "sha256:xyz" }, "job.bundle"},
		{"empty argv", func(j *Job) { j.Argv = nil }, "job.argv"},
		{"empty argv0", func(j *Job) { j.Argv = []string{""} }, "job.argv"},
		{"argv NUL", func(j *Job) { j.Argv = []string{"a", "b\x00"} }, "job.argv[1]"},
		{"env name", func(j *Job) { j.Env = map[string]string{"A=B": "x"} }, "job.env"},
		{"env hostname", func(j *Job) { j.Env = map[string]string{"HOSTNAME": "x"} }, "job.env.HOSTNAME"},
		{"env over exec's bound", func(j *Job) {
			j.Env = map[string]string{}
			for i := range 40 {
				j.Env[fmt.Sprintf("PAD_%d", i)] = strings.Repeat("x", 32<<10)
			}
		}, "job.env"},
		{"workdir relative", func(j *Job) { j.WorkDir = "work" }, "job.workdir"},
		{"workdir outside", func(j *Job) { j.WorkDir = "/etc" }, "job.workdir"},
		{"workdir unclean", func(j *Job) { j.WorkDir = "/work/../etc" }, "job.workdir"},
		{"output root", func(j *Job) { j.Outputs = []string{"/work"} }, "job.outputs[0]"},
		{"output outside", func(j *Job) { j.Outputs = []string{"/bundle/out"} }, "job.outputs[0]"},
		{"output duplicate", func(j *Job) { j.Outputs = []string{"/work/o", "/work/o"} }, "job.outputs[1]"},
		{"output nested", func(j *Job) { j.Outputs = []string{"/work/o", "/work/o/sub"} }, "job.outputs[1]"},
		{"output nesting", func(j *Job) { j.Outputs = []string{"/work/o/sub", "/work/o"} }, "job.outputs[1]"},
		{"output control character", func(j *Job) { j.Outputs = []string{"/work/o\x1b[2J"} }, "job.outputs[0]"},
		{"output C1 control", func(j *Job) { j.Outputs = []string{"/work/o", "/tmp/\u0085"} }, "job.outputs[1]"},
		{"input name", func(j *Job) { j.Inputs[0].Name = "Bundle" }, "job.inputs[0].name"},
		{"input digest", func(j *Job) { j.Inputs[0].Digest = "md5:00" }, "job.inputs[0].digest"},
		{"input ro under work", func(j *Job) { j.Inputs[0].Path = "/work/b" }, "job.inputs[0].path"},
		{"input writable outside work", func(j *Job) { j.Inputs[1].Path = "/inputs/w" }, "job.inputs[1].path"},
		{"input inputs root", func(j *Job) { j.Inputs[0].Path = InputsPath }, "job.inputs[0].path"},
		{"input duplicate name", func(j *Job) { j.Inputs[1].Name = "bundle" }, "job.inputs[1].name"},
		{"limit memory low", func(j *Job) { j.Limits.MemoryBytes = 1 }, "job.limits.memory_bytes"},
		{"limit wall zero", func(j *Job) { j.Limits.WallTimeMS = 0 }, "job.limits.wall_time_ms"},
		{"limit pids huge", func(j *Job) { j.Limits.Pids = 1 << 40 }, "job.limits.pids"},
		{"limit negative output", func(j *Job) { j.Limits.OutputBytes = -1 }, "job.limits.output_bytes"},
		{"network", func(j *Job) { j.Network = "bridge" }, "job.network"},
		{"runtime", func(j *Job) { j.Runtime = "kata" }, "job.runtime"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := validJob()
			tc.mod(&j)
			err := j.Validate()
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("got %v, want a FieldError", err)
			}
			if fe.Field != tc.field {
				t.Fatalf("got field %q (%v), want %q", fe.Field, err, tc.field)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("%v does not match ErrInvalid", err)
			}
		})
	}
	j := validJob()
	if err := j.Validate(); err != nil {
		t.Fatalf("the valid job: %v", err)
	}
}

func TestSealAndDecode(t *testing.T) {
	j := validJob()
	if err := j.Seal(); err != nil {
		t.Fatal(err)
	}
	data, err := j.CanonicalJSON()
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeJob(data)
	if err != nil {
		t.Fatalf("decode sealed job: %v", err)
	}
	if got.Digest != j.Digest {
		t.Fatalf("digest %s, want %s", got.Digest, j.Digest)
	}
	// Sealing is deterministic and independent of map order.
	k := validJob()
	k.Env = map[string]string{"GOFLAGS": "-count=1"}
	k.Seal()
	if k.Digest != j.Digest {
		t.Fatalf("same job sealed to %s and %s", k.Digest, j.Digest)
	}
	for _, tc := range []struct {
		name, data, want string
	}{
		{"unknown field", strings.Replace(string(data), `"argv":`, `"extra":1,"argv":`, 1), "unknown field"},
		{"changed content", strings.Replace(string(data), `"-count=1"`, `"-count=2"`, 1), "job.digest"},
		{"malformed digest", strings.Replace(string(data), j.Digest, "sha256:00", 1), "job.digest"},
		{"trailing data", string(data) + "{}", "trailing"},
		{"unsealed", strings.Replace(string(data), `"digest":"`+j.Digest+`",`, "", 1), "not sealed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeJob([]byte(tc.data))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestCanonicalJSON(t *testing.T) {
	for _, tc := range []struct {
		in   any
		want string
	}{
		{map[string]any{"b": 1, "a": []int{2, 1}}, `{"a":[2,1],"b":1}`},
		{map[string]string{"x": "<&>"}, `{"x":"<&>"}`},
		{struct {
			Z int `json:"z"`
			A struct {
				D, C int
			} `json:"a"`
		}{1, struct{ D, C int }{4, 3}}, `{"a":{"C":3,"D":4},"z":1}`},
		{map[string]any{"big": int64(1) << 60}, `{"big":1152921504606846976}`},
	} {
		got, err := CanonicalJSON(tc.in)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != tc.want {
			t.Errorf("got %s, want %s", got, tc.want)
		}
	}
}

// The grammars bound their lengths apart from their patterns (a counted
// repetition costs every process its compilation): the longest name is
// taken, one byte more is not, whatever the bytes.
func TestNameGrammarsBoundTheirLength(t *testing.T) {
	for _, c := range []struct {
		name  string
		valid func(string) bool
		max   int
	}{
		{"job id", validJobID, 128},
		{"input name", validInputName, 64},
		{"environment key", validEnvKey, 128},
		{"instance", ValidInstance, MaxInstanceBytes},
	} {
		if !c.valid("a" + strings.Repeat("b", c.max-1)) {
			t.Errorf("%s of %d bytes refused", c.name, c.max)
		}
		if c.valid("a" + strings.Repeat("b", c.max)) {
			t.Errorf("%s of %d bytes taken", c.name, c.max+1)
		}
		for _, bad := range []string{"", "-a", "a/b", "a b", "a\n", "é"} {
			if c.valid(bad) {
				t.Errorf("%s %q taken", c.name, bad)
			}
		}
	}
}
