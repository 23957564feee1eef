package sandbox_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/receipt"
	"github.com/sandboxd/sandboxd/sandbox"
)

var update = flag.Bool("update", false, "rewrite the golden envelopes in testdata/receipt")

const goldenDir = "testdata/receipt"

// goldenPassword protects testdata/receipt/broker.key, a key for tests only.
var goldenPassword = []byte("sandboxd-golden")

var (
	goldenFacts = sandbox.RuntimeFacts{
		BrokerVersion: "0.1.0-golden",
		EngineVersion: "20.10.24",
		EngineAPI:     "1.41",
		Runtime:       "runc",
		SeccompDigest: "sha256:" + strings.Repeat("5e", 32),
		ShimDigest:    "sha256:" + strings.Repeat("51", 32),
	}
	goldenAt = time.Date(2025, 1, 2, 3, 4, 5, 600, time.UTC)
)

func newJob(t testing.TB, id string) sandbox.Job {
	t.Helper()
	j := sandbox.Job{
		Schema: sandbox.JobSchema,
		ID:     id,
		Image:  "sha256:" + strings.Repeat("a1", 32),
		Bundle: "sha256:" + strings.Repeat("b2", 32),
		Inputs: []sandbox.Input{
			{Name: "bundle", Digest: "sha256:" + strings.Repeat("c3", 32), Path: sandbox.BundlePath},
			{Name: "workspace", Digest: "sha256:" + strings.Repeat("d4", 32), Path: "/work/src", Writable: true},
		},
		Argv:    []string{"/bundle/grade", "--report", "/work/out/report.json"},
		Env:     map[string]string{"LANG": "C.UTF-8"},
		WorkDir: "/work/src",
		Outputs: []string{"/work/out"},
		Limits:  sandbox.DefaultLimits(),
		Network: sandbox.NetworkNone,
		Runtime: sandbox.RuntimeRunc,
	}
	if err := j.Seal(); err != nil {
		t.Fatalf("seal %s: %v", id, err)
	}
	return j
}

func newResult(job sandbox.Job) sandbox.Result {
	return sandbox.Result{
		Schema:    sandbox.ResultSchema,
		JobID:     job.ID,
		JobDigest: job.Digest,
		Status:    sandbox.StatusFailed,
		ExitCode:  1,
		LimitsHit: []string{},
		StartedAt: goldenAt.Add(2 * time.Second),
		EndedAt:   goldenAt.Add(9 * time.Second),
		Usage:     sandbox.Usage{WallTimeMS: 7000, WorkBytesUsed: 4096},
		Security: sandbox.Security{
			User: "65534:65534", CandidateUID: 65534, CapDrop: []string{"ALL"}, NoNewPrivs: true,
			SeccompDigest: goldenFacts.SeccompDigest, ReadonlyRootfs: true, NetworkMode: "none",
			Memory: 1 << 30, MemorySwap: 1 << 30, PidsLimit: 256, Init: true, Runtime: "runc",
		},
		Runtime: goldenFacts,
		Stdout:  sandbox.Log{Digest: sandbox.DigestBytes([]byte("ok\n")), Bytes: 3, Total: 3},
		Stderr:  sandbox.Log{Digest: sandbox.DigestBytes(nil)},
		Artifacts: []sandbox.Artifact{
			{Path: "/work/out/junit.xml", Digest: sandbox.DigestBytes([]byte("<testsuites/>")), Size: 13, MediaType: "application/xml"},
			{Path: "/work/out/report.json", Digest: sandbox.DigestBytes([]byte(`{"tests":[]}`)), Size: 12, MediaType: "application/json"},
		},
		Rejected: []sandbox.Rejected{{Path: "/work/out/link", Reason: "symlink"}},
	}
}

func readFile(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(goldenDir, name))
	if err != nil {
		t.Fatalf("%v (run go test ./sandbox/ -run TestGolden -update to create it)", err)
	}
	return b
}

func writeFile(t testing.TB, name string, data []byte, perm os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(goldenDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(goldenDir, name), data, perm); err != nil {
		t.Fatal(err)
	}
}

func indentedPayload(t testing.TB, envelope []byte) []byte {
	t.Helper()
	var env sandbox.Envelope
	if err := json.Unmarshal(envelope, &env); err != nil {
		t.Fatal(err)
	}
	payload, err := base64.StdEncoding.DecodeString(env.Payload)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := json.Indent(&out, payload, "", "  "); err != nil {
		t.Fatal(err)
	}
	return append(out.Bytes(), '\n')
}

// TestGolden keeps the receipt and result formats stable: the golden
// envelopes verify, and signing the same inputs again gives the same
// payload type, payload and key ids (the ECDSA signatures themselves are
// randomized, so they are verified rather than compared).
func TestGolden(t *testing.T) {
	if *update {
		if _, err := os.Stat(filepath.Join(goldenDir, "broker.key")); errors.Is(err, os.ErrNotExist) {
			priv, pub, err := receipt.GenerateKeyPair(goldenPassword)
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, "broker.key", priv, 0o600)
			writeFile(t, "broker.pub", pub, 0o644)
		}
		job := newJob(t, "golden-1")
		jb, _ := json.MarshalIndent(job, "", "  ")
		writeFile(t, "job.json", append(jb, '\n'), 0o644)
		rb, _ := json.MarshalIndent(newResult(job), "", "  ")
		writeFile(t, "result.json", append(rb, '\n'), 0o644)
	}
	job, err := sandbox.DecodeJob(readFile(t, "job.json"))
	if err != nil {
		t.Fatalf("job.json: %v", err)
	}
	res, err := sandbox.DecodeResult(readFile(t, "result.json"))
	if err != nil {
		t.Fatalf("result.json: %v", err)
	}
	keys, err := sandbox.ParseKeySet(readFile(t, "broker.pub"))
	if err != nil {
		t.Fatal(err)
	}
	signer, err := receipt.ParseSigner(readFile(t, "broker.key"), goldenPassword)
	if err != nil {
		t.Fatal(err)
	}
	acc, err := signer.SignAccepted(job, goldenFacts, goldenAt)
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		comp, err := signer.SignCompleted(res, acc)
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, "accepted.intoto.json", acc, 0o644)
		writeFile(t, "completed.intoto.json", comp, 0o644)
		writeFile(t, "accepted.statement.json", indentedPayload(t, acc), 0o644)
		writeFile(t, "completed.statement.json", indentedPayload(t, comp), 0o644)
	}
	goldenAcc := readFile(t, "accepted.intoto.json")
	goldenComp := readFile(t, "completed.intoto.json")

	// The golden envelopes verify and say what they were made from.
	rc, err := sandbox.VerifyReceipt(keys, goldenAcc, job)
	if err != nil {
		t.Fatalf("VerifyReceipt(golden): %v", err)
	}
	if rc.Job.Digest != job.Digest || rc.Runtime != goldenFacts || !rc.AcceptedAt.Equal(goldenAt) || rc.Broker.KeyID != signer.KeyID() {
		t.Errorf("golden receipt: got %+v", rc)
	}
	got, err := sandbox.VerifyResult(keys, goldenComp, job, goldenAcc)
	if err != nil {
		t.Fatalf("VerifyResult(golden): %v", err)
	}
	want := res
	want.ReceiptDigest = sandbox.DigestBytes(goldenAcc)
	gotJSON, _ := sandbox.CanonicalJSON(got)
	wantJSON, _ := sandbox.CanonicalJSON(want)
	if !bytes.Equal(gotJSON, wantJSON) {
		t.Errorf("golden result:\n got %s\nwant %s", gotJSON, wantJSON)
	}

	// Signing again reproduces every deterministic part.
	comp, err := signer.SignCompleted(res, goldenAcc)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name         string
		fresh, gold  []byte
		statementNew []byte
	}{
		{"accepted", acc, goldenAcc, readFile(t, "accepted.statement.json")},
		{"completed", comp, goldenComp, readFile(t, "completed.statement.json")},
	} {
		var f, g sandbox.Envelope
		if err := json.Unmarshal(tt.fresh, &f); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(tt.gold, &g); err != nil {
			t.Fatal(err)
		}
		if f.PayloadType != g.PayloadType {
			t.Errorf("%s payloadType: got %q, want %q", tt.name, f.PayloadType, g.PayloadType)
		}
		if f.Payload != g.Payload {
			t.Errorf("%s payload differs from golden:\n got %s\nwant %s", tt.name, indentedPayload(t, tt.fresh), indentedPayload(t, tt.gold))
		}
		if len(f.Signatures) != len(g.Signatures) || f.Signatures[0].KeyID != g.Signatures[0].KeyID {
			t.Errorf("%s signatures: got %+v, want key ids of %+v", tt.name, f.Signatures, g.Signatures)
		}
		if s := indentedPayload(t, tt.gold); !bytes.Equal(s, tt.statementNew) {
			t.Errorf("%s.statement.json is not the golden envelope's payload:\n got %s\nwant %s", tt.name, tt.statementNew, s)
		}
	}
}

// Ephemeral keys keep the tampering tests fast (no scrypt).
var (
	signersOnce sync.Once
	signerA     *receipt.Signer
	signerB     *receipt.Signer
	signersErr  error
)

func signers(t testing.TB) (a, b *receipt.Signer) {
	t.Helper()
	signersOnce.Do(func() {
		if signerA, signersErr = receipt.NewEphemeralSigner(); signersErr == nil {
			signerB, signersErr = receipt.NewEphemeralSigner()
		}
	})
	if signersErr != nil {
		t.Fatal(signersErr)
	}
	return signerA, signerB
}

func keySet(t testing.TB, ss ...*receipt.Signer) sandbox.KeySet {
	t.Helper()
	var pems [][]byte
	for _, s := range ss {
		pems = append(pems, s.PublicKeyPEM())
	}
	ks, err := sandbox.ParseKeySet(pems...)
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

func mustSign(t testing.TB) func([]byte, error) []byte {
	return func(env []byte, err error) []byte {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return env
	}
}

// editEnvelope changes an envelope without re-signing it.
func editEnvelope(t testing.TB, envelope []byte, edit func(*sandbox.Envelope)) []byte {
	t.Helper()
	var env sandbox.Envelope
	if err := json.Unmarshal(envelope, &env); err != nil {
		t.Fatal(err)
	}
	env.Signatures = append([]sandbox.Signature(nil), env.Signatures...)
	edit(&env)
	out, err := sandbox.CanonicalEnvelope(env)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// resign changes the statement and signs it again with a pinned key: what
// a broker bug, or a stolen key used carelessly, would produce.
func resign(t testing.TB, s *receipt.Signer, envelope []byte, edit func(*sandbox.Statement)) []byte {
	t.Helper()
	var env sandbox.Envelope
	if err := json.Unmarshal(envelope, &env); err != nil {
		t.Fatal(err)
	}
	payload, _ := base64.StdEncoding.DecodeString(env.Payload)
	var st sandbox.Statement
	if err := json.Unmarshal(payload, &st); err != nil {
		t.Fatal(err)
	}
	edit(&st)
	out, err := s.SignStatement(st)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func flipB64(t testing.TB, s string, at func(n int) int) string {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	b[at(len(b))] ^= 0x01
	return base64.StdEncoding.EncodeToString(b)
}

func TestTamperingIsRejected(t *testing.T) {
	a, b := signers(t)
	job1, job2 := newJob(t, "job-1"), newJob(t, "job-2")
	acc1 := mustSign(t)(a.SignAccepted(job1, goldenFacts, goldenAt))
	acc2 := mustSign(t)(a.SignAccepted(job2, goldenFacts, goldenAt))
	comp1 := mustSign(t)(a.SignCompleted(newResult(job1), acc1))
	accByB := mustSign(t)(b.SignAccepted(job1, goldenFacts, goldenAt))
	compChainedToB := mustSign(t)(a.SignCompleted(newResult(job1), accByB))
	pinA := keySet(t, a)
	pinAB := keySet(t, a, b)

	receiptOf := func(keys sandbox.KeySet, env []byte, job sandbox.Job) func() error {
		return func() error { _, err := sandbox.VerifyReceipt(keys, env, job); return err }
	}
	resultOf := func(keys sandbox.KeySet, env []byte, job sandbox.Job, rcpt []byte) func() error {
		return func() error { _, err := sandbox.VerifyResult(keys, env, job, rcpt); return err }
	}

	tests := []struct {
		name   string
		verify func() error
		want   error
	}{
		{"untouched receipt", receiptOf(pinA, acc1, job1), nil},
		{"untouched result", resultOf(pinA, comp1, job1, acc1), nil},
		{"payload byte flipped", receiptOf(pinA, editEnvelope(t, acc1, func(e *sandbox.Envelope) {
			e.Payload = flipB64(t, e.Payload, func(n int) int { return n / 2 })
		}), job1), sandbox.ErrSignature},
		{"signature byte flipped", receiptOf(pinA, editEnvelope(t, acc1, func(e *sandbox.Envelope) {
			e.Signatures[0].Sig = flipB64(t, e.Signatures[0].Sig, func(n int) int { return n - 3 })
		}), job1), sandbox.ErrSignature},
		{"payload type changed", receiptOf(pinA, editEnvelope(t, acc1, func(e *sandbox.Envelope) {
			e.PayloadType = "application/json"
		}), job1), sandbox.ErrPayloadType},
		{"predicate type changed", receiptOf(pinA, resign(t, a, acc1, func(st *sandbox.Statement) {
			st.PredicateType = "https://slsa.dev/provenance/v1"
		}), job1), sandbox.ErrPredicateType},
		{"result offered as receipt", receiptOf(pinA, comp1, job1), sandbox.ErrPredicateType},
		{"receipt offered as result", resultOf(pinA, acc1, job1, acc1), sandbox.ErrPredicateType},
		{"statement type changed", receiptOf(pinA, resign(t, a, acc1, func(st *sandbox.Statement) {
			st.Type = "https://in-toto.io/Statement/v0.1"
		}), job1), sandbox.ErrStatementType},
		{"receipt subject digest swapped", receiptOf(pinA, resign(t, a, acc1, func(st *sandbox.Statement) {
			st.Subject[0].Digest["sha256"] = strings.TrimPrefix(job2.Digest, "sha256:")
		}), job1), sandbox.ErrSubject},
		{"result subject digests swapped", resultOf(pinA, resign(t, a, comp1, func(st *sandbox.Statement) {
			st.Subject[1].Digest, st.Subject[2].Digest = st.Subject[2].Digest, st.Subject[1].Digest
		}), job1, acc1), sandbox.ErrSubject},
		{"result subject dropped", resultOf(pinA, resign(t, a, comp1, func(st *sandbox.Statement) {
			st.Subject = st.Subject[:1]
		}), job1, acc1), sandbox.ErrSubject},
		{"predicate with an unknown field", receiptOf(pinA, resign(t, a, acc1, func(st *sandbox.Statement) {
			st.Predicate = append(st.Predicate[:len(st.Predicate)-1:len(st.Predicate)-1], []byte(`,"extra":1}`)...)
		}), job1), sandbox.ErrPredicate},
		{"receipt replayed for another job", receiptOf(pinA, acc1, job2), sandbox.ErrJobBinding},
		{"result replayed for another job", resultOf(pinA, comp1, job2, acc2), sandbox.ErrJobBinding},
		{"result paired with another job's receipt", resultOf(pinA, comp1, job1, acc2), sandbox.ErrReceiptBinding},
		{"result chained to a receipt by an unpinned key", resultOf(pinA, compChainedToB, job1, accByB), sandbox.ErrUnknownKey},
		{"wrong key", receiptOf(pinA, accByB, job1), sandbox.ErrUnknownKey},
		{"key id naming another key", receiptOf(pinA, editEnvelope(t, acc1, func(e *sandbox.Envelope) {
			e.Signatures[0].KeyID = b.KeyID()
		}), job1), sandbox.ErrKeyIDMismatch},
		{"key id naming another pinned key", receiptOf(pinAB, editEnvelope(t, acc1, func(e *sandbox.Envelope) {
			e.Signatures[0].KeyID = b.KeyID()
		}), job1), sandbox.ErrKeyIDMismatch},
		{"bad signature beside a good one", receiptOf(pinAB, editEnvelope(t, acc1, func(e *sandbox.Envelope) {
			var other sandbox.Envelope
			_ = json.Unmarshal(accByB, &other)
			e.Signatures = append(e.Signatures, other.Signatures[0]) // B signed other bytes
		}), job1), sandbox.ErrSignature},
		{"truncated envelope", receiptOf(pinA, acc1[:len(acc1)/2], job1), sandbox.ErrMalformedEnvelope},
		{"payload not base64", receiptOf(pinA, editEnvelope(t, acc1, func(e *sandbox.Envelope) {
			e.Payload = "%%%"
		}), job1), sandbox.ErrMalformedEnvelope},
		{"empty signature list", receiptOf(pinA, editEnvelope(t, acc1, func(e *sandbox.Envelope) {
			e.Signatures = nil
		}), job1), sandbox.ErrNoSignatures},
		{"no key pinned", receiptOf(sandbox.KeySet{}, acc1, job1), sandbox.ErrUnknownKey},
	}
	checks := []error{
		sandbox.ErrMalformedEnvelope, sandbox.ErrNoSignatures, sandbox.ErrPayloadType, sandbox.ErrSignature,
		sandbox.ErrUnknownKey, sandbox.ErrKeyIDMismatch, sandbox.ErrStatementType, sandbox.ErrPredicateType,
		sandbox.ErrPredicate, sandbox.ErrSubject, sandbox.ErrJobBinding, sandbox.ErrReceiptBinding,
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.verify()
			if tt.want == nil {
				if err != nil {
					t.Fatalf("got %v, want it to verify", err)
				}
				return
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
			for _, c := range checks {
				if c != tt.want && errors.Is(err, c) {
					t.Errorf("got %v, which also matches %v", err, c)
				}
			}
			var ve *sandbox.VerifyError
			if !errors.As(err, &ve) || ve.Detail == "" {
				t.Errorf("got %#v, want a *VerifyError with a detail", err)
			}
		})
	}
}

func TestRotation(t *testing.T) {
	oldKey, newKey := signers(t)
	third, err := receipt.NewEphemeralSigner()
	if err != nil {
		t.Fatal(err)
	}
	both, err := newKey.AlsoSignWith(oldKey)
	if err != nil {
		t.Fatal(err)
	}
	job := newJob(t, "job-rot")
	acc := mustSign(t)(both.SignAccepted(job, goldenFacts, goldenAt))
	comp := mustSign(t)(both.SignCompleted(newResult(job), acc))
	var env sandbox.Envelope
	if err := json.Unmarshal(acc, &env); err != nil {
		t.Fatal(err)
	}
	if len(env.Signatures) != 2 || env.Signatures[0].KeyID != newKey.KeyID() || env.Signatures[1].KeyID != oldKey.KeyID() {
		t.Fatalf("signatures: got %+v, want new then old key", env.Signatures)
	}
	for _, tt := range []struct {
		name    string
		pinned  []*receipt.Signer
		wantIDs []string
		wantErr error
	}{
		{"old key alone", []*receipt.Signer{oldKey}, []string{oldKey.KeyID()}, nil},
		{"new key alone", []*receipt.Signer{newKey}, []string{newKey.KeyID()}, nil},
		{"both", []*receipt.Signer{oldKey, newKey}, []string{newKey.KeyID(), oldKey.KeyID()}, nil},
		{"neither", []*receipt.Signer{third}, nil, sandbox.ErrUnknownKey},
	} {
		t.Run(tt.name, func(t *testing.T) {
			keys := keySet(t, tt.pinned...)
			att, err := sandbox.VerifyAttestation(keys, acc)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("VerifyAttestation: got %v, want %v", err, tt.wantErr)
			}
			if tt.wantErr != nil {
				return
			}
			if strings.Join(att.KeyIDs, ",") != strings.Join(tt.wantIDs, ",") {
				t.Errorf("verified key ids: got %v, want %v", att.KeyIDs, tt.wantIDs)
			}
			if att.Receipt.Broker.KeyID != newKey.KeyID() {
				t.Errorf("broker key id: got %s, want the new key %s", att.Receipt.Broker.KeyID, newKey.KeyID())
			}
			if _, err := sandbox.VerifyResult(keys, comp, job, acc); err != nil {
				t.Errorf("VerifyResult: got %v, want it to verify", err)
			}
		})
	}
}

func TestEnvelopeDigestIgnoresLayout(t *testing.T) {
	a, _ := signers(t)
	acc := mustSign(t)(a.SignAccepted(newJob(t, "job-1"), goldenFacts, goldenAt))
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, acc, "", "\t"); err != nil {
		t.Fatal(err)
	}
	got, err := sandbox.EnvelopeDigest(pretty.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if want := sandbox.DigestBytes(acc); got != want {
		t.Errorf("digest of the re-indented envelope: got %s, want %s (sha256 of the bytes as signed)", got, want)
	}
	extra := append(acc[:len(acc)-1:len(acc)-1], []byte(`,"x":1}`)...)
	if _, err := sandbox.EnvelopeDigest(extra); !errors.Is(err, sandbox.ErrMalformedEnvelope) {
		t.Errorf("envelope with an extra field: got %v, want ErrMalformedEnvelope", err)
	}
}

func pemOf(t *testing.T, typ string, der []byte) []byte {
	t.Helper()
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func pkix(t *testing.T, pub any) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return pemOf(t, "PUBLIC KEY", der)
}

func TestParseKeySet(t *testing.T) {
	a, b := signers(t)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	edPub, _, _ := ed25519.GenerateKey(rand.Reader)
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	privDER, _ := x509.MarshalPKCS8PrivateKey(p256)

	tests := []struct {
		name    string
		pems    [][]byte
		wantIDs int
		wantMsg string
	}{
		{"one key", [][]byte{a.PublicKeyPEM()}, 1, ""},
		{"two files", [][]byte{a.PublicKeyPEM(), b.PublicKeyPEM()}, 2, ""},
		{"two blocks in one file", [][]byte{append(a.PublicKeyPEM(), b.PublicKeyPEM()...)}, 2, ""},
		{"same key twice", [][]byte{a.PublicKeyPEM(), a.PublicKeyPEM()}, 1, ""},
		{"nothing", nil, 0, "no public key"},
		{"empty file", [][]byte{[]byte("\n")}, 0, "empty"},
		{"not PEM", [][]byte{[]byte("ssh-ed25519 AAAA")}, 0, "not PEM"},
		{"truncated PEM", [][]byte{a.PublicKeyPEM()[:40]}, 0, "not PEM"},
		{"trailing garbage", [][]byte{append(a.PublicKeyPEM(), "junk"...)}, 0, "not PEM"},
		{"private key", [][]byte{pemOf(t, "PRIVATE KEY", privDER)}, 0, `"PRIVATE KEY" is not a "PUBLIC KEY"`},
		{"garbled DER", [][]byte{pemOf(t, "PUBLIC KEY", []byte("nope"))}, 0, "asn1"},
		{"P-384", [][]byte{pkix(t, p384.Public())}, 0, "unsupported key type ECDSA P-384"},
		{"RSA", [][]byte{pkix(t, rsaKey.Public())}, 0, "unsupported key type *rsa.PublicKey"},
		{"Ed25519", [][]byte{pkix(t, edPub)}, 0, "unsupported key type ed25519.PublicKey"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ks, err := sandbox.ParseKeySet(tt.pems...)
			if tt.wantMsg == "" {
				if err != nil {
					t.Fatalf("got %v, want no error", err)
				}
				if got := len(ks.KeyIDs()); got != tt.wantIDs {
					t.Errorf("keys: got %d, want %d", got, tt.wantIDs)
				}
				return
			}
			if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("got %v, want ErrInvalid mentioning %q", err, tt.wantMsg)
			}
		})
	}
}

// TestVerifierNeedsOnlyTheStandardLibrary: a verifier importing sandbox
// must not pull in sigstore, protobuf or the engine client.
func TestVerifierNeedsOnlyTheStandardLibrary(t *testing.T) {
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(goBin, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "github.com/sandboxd/sandboxd/sandbox").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	if got := strings.Fields(string(out)); len(got) != 1 || got[0] != "github.com/sandboxd/sandboxd/sandbox" {
		t.Errorf("non-standard dependencies of sandbox: got %v, want only the package itself", got)
	}
}

func BenchmarkVerifyReceipt(b *testing.B) {
	a, _ := signers(b)
	job := newJob(b, "job-1")
	acc := mustSign(b)(a.SignAccepted(job, goldenFacts, goldenAt))
	keys := keySet(b, a)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := sandbox.VerifyReceipt(keys, acc, job); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerifyResult includes verifying the chained receipt: two
// envelopes, two signature checks.
func BenchmarkVerifyResult(b *testing.B) {
	a, _ := signers(b)
	job := newJob(b, "job-1")
	acc := mustSign(b)(a.SignAccepted(job, goldenFacts, goldenAt))
	comp := mustSign(b)(a.SignCompleted(newResult(job), acc))
	keys := keySet(b, a)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := sandbox.VerifyResult(keys, comp, job, acc); err != nil {
			b.Fatal(err)
		}
	}
}
