package sandbox

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// Admission refuses a file_count whose worst-case result could be over
// MaxResultBytes, naming the field and the largest value allowed.
func TestFileCountBoundAtAdmission(t *testing.T) {
	for _, tc := range []struct {
		name      string
		fileCount int64
		wantErr   bool
	}{
		{"default", DefaultLimits().FileCount, false},
		{"the bench's", 10_000, false},
		{"the largest allowed", MaxFileCount, false},
		{"one more", MaxFileCount + 1, true},
		{"the old maximum", 1_000_000, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := validJob()
			j.Limits.FileCount = tc.fileCount
			err := j.Validate()
			if !tc.wantErr {
				if err != nil {
					t.Fatalf("file_count %d: got %v, want no error", tc.fileCount, err)
				}
				if b := ResultBound(j.Limits); b > MaxResultBytes {
					t.Fatalf("file_count %d accepted, but its result can take %d bytes, over %d", tc.fileCount, b, MaxResultBytes)
				}
				return
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != "job.limits.file_count" {
				t.Fatalf("file_count %d: got %v, want an error on job.limits.file_count", tc.fileCount, err)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("%v does not match ErrInvalid", err)
			}
			for _, want := range []string{fmt.Sprint(MaxFileCount), fmt.Sprint(MaxResultBytes)} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("got %q, want it to name %s", err, want)
				}
			}
		})
	}
}

// MaxFileCount is exactly the most artifacts whose worst case fits.
func TestMaxFileCountIsTheLargestThatFits(t *testing.T) {
	if b := ResultBound(Limits{FileCount: MaxFileCount}); b > MaxResultBytes {
		t.Errorf("ResultBound(MaxFileCount %d) = %d, over MaxResultBytes %d", MaxFileCount, b, MaxResultBytes)
	}
	if b := ResultBound(Limits{FileCount: MaxFileCount + 1}); b <= MaxResultBytes {
		t.Errorf("ResultBound(MaxFileCount+1) = %d still fits %d: MaxFileCount is not the largest", b, MaxResultBytes)
	}
	if MaxFileCount < 2*DefaultLimits().FileCount {
		t.Errorf("MaxFileCount %d leaves the default file_count %d no room", MaxFileCount, DefaultLimits().FileCount)
	}
}

// worstArtifact is an artifact at its largest in the encoded result: a
// path of MaxArtifactPathBytes that JSON escapes to twice its length (the
// characters that escape to more are refused by the broker), the longest
// media type the broker writes and the largest size.
func worstArtifact(i int, escape string) Artifact {
	prefix := fmt.Sprintf("/work/out/%06d/", i)
	p := prefix + strings.Repeat(escape, (MaxArtifactPathBytes-len(prefix))/len(escape))
	p += strings.Repeat("x", MaxArtifactPathBytes-len(p))
	return Artifact{Path: p, Digest: "sha256:" + strings.Repeat("f", 64), Size: 1<<63 - 1, MediaType: "application/octet-stream"}
}

// The size a result is checked against before it is signed is never
// smaller than its real envelope, and the worst case for its file_count
// is never smaller than either: here against a statement encoded and
// wrapped as the signer does (the signatures stand in at their size).
func TestResultBoundCoversRealResults(t *testing.T) {
	for _, tc := range []struct {
		name   string
		files  int
		escape string // what the paths are made of
		rest   bool   // everything else at its largest too
	}{
		{"nothing", 0, "x", false},
		{"no artifacts, the rest at its largest", 0, "x", true},
		{"one plain", 1, "x", false},
		{"quotes", 100, `"`, false},
		{"backslashes", 100, `\`, false},
		{"line separators", 100, "\u2028", false},
		{"multibyte", 100, "é", false},
		{"many, the rest at its largest", 1000, `"`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := worstResult(tc.files, tc.escape, tc.rest)
			env := signedSize(t, res)
			size, err := ResultSize(res)
			if err != nil {
				t.Fatal(err)
			}
			bound := ResultBound(Limits{FileCount: int64(tc.files)})
			if int64(env) > size {
				t.Errorf("%d artifacts: the envelope takes %d bytes, ResultSize says at most %d", tc.files, env, size)
			}
			if size > bound {
				t.Errorf("%d artifacts: ResultSize %d, over the worst case ResultBound %d", tc.files, size, bound)
			}
			if tc.escape == `"` && !tc.rest {
				// The worst case is tight per artifact: each one here is
				// at its largest but for its media type (the bound allows
				// 64 bytes, the broker writes at most 24).
				per := (bound - ResultBound(Limits{})) / int64(tc.files)
				real := int64(env-signedSize(t, worstResult(0, "x", false))) / int64(tc.files)
				if real < per*9/10 {
					t.Errorf("a worst artifact takes %d bytes, the bound allows %d: not a worst case", real, per)
				}
			}
		})
	}
}

// worstResult is a result with files worst-case artifacts and, with rest,
// everything else as large as the broker makes it: 1,025 rejected entries
// of 1,027 bytes of path and of reason, a cause of 32 KiB and 32 input
// mounts.
func worstResult(files int, escape string, rest bool) Result {
	res := validResult()
	res.Artifacts = make([]Artifact, files)
	for i := range res.Artifacts {
		res.Artifacts[i] = worstArtifact(i, escape)
	}
	if !rest {
		return res
	}
	text := strings.Repeat(`"`, 1024) + "…"
	for range 1025 {
		res.Rejected = append(res.Rejected, Rejected{Path: text, Reason: text})
	}
	res.Cause = strings.Repeat(`\`, 32<<10) + "…"
	for i := range 32 {
		res.Security.Mounts = append(res.Security.Mounts, Mount{Type: "volume", Source: fmt.Sprintf("sandboxd-input-%064d", i), Target: "/inputs/" + strings.Repeat(`"`, 1016), ReadOnly: true})
	}
	return res
}

func validResult() Result {
	return Result{
		Schema: ResultSchema, JobID: strings.Repeat("j", 128), JobDigest: "sha256:" + strings.Repeat("a", 64),
		ReceiptDigest: "sha256:" + strings.Repeat("b", 64), Status: StatusLimitExceeded, Limit: "file_count",
		LimitsHit: []string{"disk_bytes", "file_count", "file_size_bytes", "log_bytes", "output_bytes", "pids"},
		Artifacts: []Artifact{}, Rejected: []Rejected{},
	}
}

// signedSize is the size of res's envelope as the signer makes it: the
// canonical statement, base64, and two P-256 signatures at their largest
// (a key rotation signs with two keys).
func signedSize(t *testing.T, res Result) int {
	t.Helper()
	subjects, err := ResultSubjects(res)
	if err != nil {
		t.Fatal(err)
	}
	pred, err := CanonicalJSON(Completion{Result: res, ReceiptDigest: res.ReceiptDigest,
		Broker: BrokerIdentity{Name: strings.Repeat("b", 64), KeyID: "SHA256:" + strings.Repeat("k", 43), Version: "0.1.0-dev+" + strings.Repeat("0", 40)}})
	if err != nil {
		t.Fatal(err)
	}
	payload, err := CanonicalJSON(Statement{Type: StatementType, Subject: subjects, PredicateType: PredicateCompleted, Predicate: pred})
	if err != nil {
		t.Fatal(err)
	}
	sig := Signature{KeyID: "SHA256:" + strings.Repeat("k", 43), Sig: strings.Repeat("s", 96)}
	env, err := CanonicalEnvelope(Envelope{PayloadType: InTotoPayloadType, Payload: base64.StdEncoding.EncodeToString(payload), Signatures: []Signature{sig, sig}})
	if err != nil {
		t.Fatal(err)
	}
	return len(env)
}
