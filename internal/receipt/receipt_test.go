package receipt

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
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	ita1 "github.com/in-toto/attestation/go/v1"
	ssldsse "github.com/secure-systems-lab/go-securesystemslib/dsse"
	"github.com/secure-systems-lab/go-securesystemslib/encrypted"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sandboxd/sandboxd/sandbox"
)

func testJob(t testing.TB, id string) sandbox.Job {
	t.Helper()
	j := sandbox.Job{
		Schema:  sandbox.JobSchema,
		ID:      id,
		Image:   "sha256:" + strings.Repeat("ab", 32),
		Argv:    []string{"/bin/true"},
		WorkDir: sandbox.WorkPath,
		Outputs: []string{"/work/out"},
		Limits:  sandbox.DefaultLimits(),
		Network: sandbox.NetworkNone,
		Runtime: sandbox.RuntimeRunc,
	}
	if err := j.Seal(); err != nil {
		t.Fatalf("seal: %v", err)
	}
	return j
}

var testFacts = sandbox.RuntimeFacts{
	BrokerVersion: "0.1.0-test",
	EngineVersion: "20.10.24",
	EngineAPI:     "1.41",
	Runtime:       "runc",
	SeccompDigest: "sha256:" + strings.Repeat("01", 32),
	ShimDigest:    "sha256:" + strings.Repeat("02", 32),
}

var testAt = time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)

func testResult(job sandbox.Job) sandbox.Result {
	return sandbox.Result{
		Schema:    sandbox.ResultSchema,
		JobID:     job.ID,
		JobDigest: job.Digest,
		Status:    sandbox.StatusSucceeded,
		StartedAt: testAt.Add(time.Second),
		EndedAt:   testAt.Add(3 * time.Second),
		Runtime:   testFacts,
		Artifacts: []sandbox.Artifact{
			{Path: "/work/out/a.txt", Digest: sandbox.DigestBytes([]byte("a")), Size: 1, MediaType: "text/plain"},
			{Path: "/work/out/report.json", Digest: sandbox.DigestBytes([]byte("{}")), Size: 2, MediaType: "application/json"},
		},
	}
}

// keys are generated once: scrypt makes every encrypted key cost ~0.1-0.5 s.
var (
	keysOnce     sync.Once
	testPriv     []byte
	testPub      []byte
	testSigner   *Signer
	testKeysErr  error
	testPassword = []byte("correct horse")
)

func signer(t testing.TB) *Signer {
	t.Helper()
	keysOnce.Do(func() {
		testPriv, testPub, testKeysErr = GenerateKeyPair(testPassword)
		if testKeysErr == nil {
			testSigner, testKeysErr = ParseSigner(testPriv, testPassword)
		}
	})
	if testKeysErr != nil {
		t.Fatalf("test key: %v", testKeysErr)
	}
	return testSigner
}

func decodeEnvelope(t testing.TB, b []byte) (sandbox.Envelope, sandbox.Statement) {
	t.Helper()
	var env sandbox.Envelope
	if err := json.Unmarshal(b, &env); err != nil {
		t.Fatalf("envelope: %v", err)
	}
	payload, err := base64.StdEncoding.DecodeString(env.Payload)
	if err != nil {
		t.Fatalf("payload: %v", err)
	}
	var st sandbox.Statement
	if err := json.Unmarshal(payload, &st); err != nil {
		t.Fatalf("statement: %v", err)
	}
	return env, st
}

func TestKeyFilesAreCosignCompatible(t *testing.T) {
	for _, pw := range [][]byte{[]byte("s3cret"), {}, nil} {
		priv, pub, err := GenerateKeyPair(pw)
		if err != nil {
			t.Fatalf("GenerateKeyPair(%q): %v", pw, err)
		}
		block, _ := pem.Decode(priv)
		if block == nil || block.Type != "ENCRYPTED SIGSTORE PRIVATE KEY" {
			t.Fatalf("private PEM type: got %+v, want ENCRYPTED SIGSTORE PRIVATE KEY", block)
		}
		pubBlock, _ := pem.Decode(pub)
		if pubBlock == nil || pubBlock.Type != "PUBLIC KEY" {
			t.Fatalf("public PEM type: got %+v, want PUBLIC KEY", pubBlock)
		}
		// What cosign's LoadPrivateKey does: secretbox/scrypt, then PKCS #8.
		der, err := encrypted.Decrypt(block.Bytes, append([]byte{}, pw...))
		if err != nil {
			t.Fatalf("cosign-style decrypt with %q: %v", pw, err)
		}
		key, err := x509.ParsePKCS8PrivateKey(der)
		if err != nil {
			t.Fatalf("PKCS #8: %v", err)
		}
		// And sigstore's own reader.
		viaSigstore, err := cryptoutils.UnmarshalPEMToPrivateKey(priv, cryptoutils.StaticPasswordFunc(append([]byte{}, pw...)))
		if err != nil {
			t.Fatalf("cryptoutils.UnmarshalPEMToPrivateKey: %v", err)
		}
		wantPub, err := cryptoutils.UnmarshalPEMToPublicKey(pub)
		if err != nil {
			t.Fatalf("public key: %v", err)
		}
		for name, k := range map[string]any{"cosign-style": key, "sigstore": viaSigstore} {
			ec, ok := k.(*ecdsa.PrivateKey)
			if !ok || ec.Curve != elliptic.P256() || !ec.PublicKey.Equal(wantPub) {
				t.Errorf("%s: got %T that does not match the .pub, want the P-256 key of the pair", name, k)
			}
		}
		s, err := ParseSigner(priv, pw)
		if err != nil {
			t.Fatalf("ParseSigner: %v", err)
		}
		if got := s.PublicKeyPEM(); !bytes.Equal(got, pub) {
			t.Errorf("PublicKeyPEM: got %s, want %s", got, pub)
		}
	}
}

func encryptedPEM(t *testing.T, key any, pw []byte) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	enc, err := encrypted.Encrypt(der, pw)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED SIGSTORE PRIVATE KEY", Bytes: enc})
}

func TestParseSignerErrors(t *testing.T) {
	signer(t)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	plainDER, _ := x509.MarshalPKCS8PrivateKey(p256)
	corrupted := bytes.Clone(testPriv)
	block, _ := pem.Decode(corrupted)
	block.Bytes = bytes.Replace(block.Bytes, []byte(`"kdf"`), []byte(`"kdx"`), 1)
	corrupted = pem.EncodeToMemory(block)
	// reseal changes one field of the encrypted envelope.
	reseal := func(change func(env map[string]any)) []byte {
		block, _ := pem.Decode(testPriv)
		var env map[string]any
		if err := json.Unmarshal(block.Bytes, &env); err != nil {
			t.Fatal(err)
		}
		change(env)
		b, err := json.Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		block.Bytes = b
		return pem.EncodeToMemory(block)
	}
	weakParams := reseal(func(env map[string]any) {
		env["kdf"].(map[string]any)["params"].(map[string]any)["N"] = 1024
	})
	changedCiphertext := reseal(func(env map[string]any) {
		ct, _ := base64.StdEncoding.DecodeString(env["ciphertext"].(string))
		ct[len(ct)/2] ^= 1
		env["ciphertext"] = ct
	})

	tests := []struct {
		name    string
		pem     []byte
		pw      []byte
		wantErr error
		wantMsg string
	}{
		{"not PEM", []byte("hello"), testPassword, ErrKeyFormat, "not PEM"},
		{"truncated PEM", testPriv[:len(testPriv)/2], testPassword, ErrKeyFormat, "not PEM"},
		{"unencrypted PKCS8", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: plainDER}), nil, ErrKeyFormat, `"PRIVATE KEY"`},
		{"public key given", testPub, testPassword, ErrKeyFormat, `"PUBLIC KEY"`},
		{"wrong password", testPriv, []byte("battery staple"), ErrWrongPassword, "wrong password"},
		{"empty password for a protected key", testPriv, nil, ErrWrongPassword, "wrong password"},
		{"mangled ciphertext envelope", corrupted, testPassword, ErrKeyFormat, "unknown kdf"},
		{"scrypt parameters Decrypt refuses", weakParams, testPassword, ErrKeyFormat, "unsupported scrypt parameters"},
		{"changed ciphertext", changedCiphertext, testPassword, ErrWrongPassword, "or the key file is corrupted"},
		{"P-384", encryptedPEM(t, p384, testPassword), testPassword, ErrKeyFormat, "unsupported key type ECDSA P-384"},
		{"RSA", encryptedPEM(t, rsaKey, testPassword), testPassword, ErrKeyFormat, "unsupported key type *rsa.PrivateKey"},
		{"Ed25519", encryptedPEM(t, edKey, testPassword), testPassword, ErrKeyFormat, "unsupported key type ed25519.PrivateKey"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseSigner(tt.pem, tt.pw)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("got %v, want an error wrapping %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("got %q, want it to mention %q", err, tt.wantMsg)
			}
		})
	}
}

func TestLoadSignerFromFile(t *testing.T) {
	signer(t)
	path := filepath.Join(t.TempDir(), "broker.key")
	if err := os.WriteFile(path, testPriv, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := LoadSigner(path, testPassword)
	if err != nil {
		t.Fatalf("LoadSigner: %v", err)
	}
	if s.KeyID() != testSigner.KeyID() {
		t.Errorf("key id: got %s, want %s", s.KeyID(), testSigner.KeyID())
	}
	if _, err := LoadSigner(path+".missing", testPassword); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: got %v, want os.ErrNotExist", err)
	}
}

func TestKeyIDIsSecuresystemslibForm(t *testing.T) {
	s := signer(t)
	pub, err := cryptoutils.UnmarshalPEMToPublicKey(s.PublicKeyPEM())
	if err != nil {
		t.Fatal(err)
	}
	want, err := ssldsse.SHA256KeyID(pub)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(want, "SHA256:") {
		t.Fatalf("securesystemslib key id %q lacks SHA256: prefix", want)
	}
	got, err := sandbox.KeyID(pub.(*ecdsa.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	if got != want || s.KeyID() != want {
		t.Errorf("key ids: sandbox.KeyID %s, Signer.KeyID %s, want %s", got, s.KeyID(), want)
	}
	env, err := s.SignAccepted(testJob(t, "job-1"), testFacts, testAt)
	if err != nil {
		t.Fatal(err)
	}
	e, _ := decodeEnvelope(t, env)
	if len(e.Signatures) != 1 || e.Signatures[0].KeyID != want {
		t.Errorf("envelope signatures: got %+v, want one with keyid %s", e.Signatures, want)
	}
}

// The statement must read as an in-toto Statement v1 with the attestation
// project's own types (protojson knows the spec's field names; their structs
// under encoding/json do not).
func TestStatementMatchesInTotoTypes(t *testing.T) {
	s := signer(t)
	job := testJob(t, "job-1")
	acc, err := s.SignAccepted(job, testFacts, testAt)
	if err != nil {
		t.Fatal(err)
	}
	comp, err := s.SignCompleted(testResult(job), acc)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name          string
		env           []byte
		predicateType string
		subjects      int
	}{
		{"accepted", acc, sandbox.PredicateAccepted, 1},
		{"completed", comp, sandbox.PredicateCompleted, 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e, ours := decodeEnvelope(t, tt.env)
			payload, _ := base64.StdEncoding.DecodeString(e.Payload)
			var st ita1.Statement
			if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(payload, &st); err != nil {
				t.Fatalf("protojson: %v", err)
			}
			if err := st.Validate(); err != nil {
				t.Fatalf("in-toto Validate: %v", err)
			}
			if st.GetType() != ita1.StatementTypeUri {
				t.Errorf("_type: got %q, want %q", st.GetType(), ita1.StatementTypeUri)
			}
			if st.GetPredicateType() != tt.predicateType {
				t.Errorf("predicateType: got %q, want %q", st.GetPredicateType(), tt.predicateType)
			}
			if len(st.GetSubject()) != tt.subjects {
				t.Fatalf("subjects: got %d, want %d", len(st.GetSubject()), tt.subjects)
			}
			for i, sub := range st.GetSubject() {
				if sub.GetName() != ours.Subject[i].Name || sub.GetDigest()["sha256"] != ours.Subject[i].Digest["sha256"] {
					t.Errorf("subject %d: got %s %v, want %+v", i, sub.GetName(), sub.GetDigest(), ours.Subject[i])
				}
			}
			if len(st.GetPredicate().GetFields()) == 0 {
				t.Errorf("predicate: got no fields")
			}
			// Field names at the top level are exactly the spec's.
			var top map[string]json.RawMessage
			if err := json.Unmarshal(payload, &top); err != nil {
				t.Fatal(err)
			}
			for _, k := range []string{"_type", "subject", "predicateType", "predicate"} {
				if _, ok := top[k]; !ok {
					t.Errorf("payload lacks %q; keys are %v", k, keys(top))
				}
			}
			if len(top) != 4 {
				t.Errorf("payload keys: got %v, want exactly the 4 of the spec", keys(top))
			}
		})
	}
}

func keys(m map[string]json.RawMessage) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestSignAcceptedPayloadIsDeterministic(t *testing.T) {
	s := signer(t)
	job := testJob(t, "job-1")
	a, err := s.SignAccepted(job, testFacts, testAt)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.SignAccepted(job, testFacts, testAt.In(time.FixedZone("X", 3600)))
	if err != nil {
		t.Fatal(err)
	}
	ea, sa := decodeEnvelope(t, a)
	eb, _ := decodeEnvelope(t, b)
	if ea.Payload != eb.Payload {
		t.Errorf("payloads differ for the same inputs:\n%s\n%s", ea.Payload, eb.Payload)
	}
	if ea.PayloadType != sandbox.InTotoPayloadType {
		t.Errorf("payloadType: got %q, want %q", ea.PayloadType, sandbox.InTotoPayloadType)
	}
	var r sandbox.Receipt
	if err := json.Unmarshal(sa.Predicate, &r); err != nil {
		t.Fatal(err)
	}
	if r.AcceptedAt.Location() != time.UTC || !r.AcceptedAt.Equal(testAt) {
		t.Errorf("accepted_at: got %v, want %v in UTC", r.AcceptedAt, testAt)
	}
	if r.Broker != (sandbox.BrokerIdentity{Name: DefaultBrokerName, KeyID: s.KeyID(), Version: testFacts.BrokerVersion}) {
		t.Errorf("broker: got %+v", r.Broker)
	}
	if r.Job.Digest != job.Digest || r.Job.Inputs == nil || r.Job.Env == nil {
		t.Errorf("job in receipt: got %+v, want the sealed job with [] and {} for empty collections", r.Job)
	}
	canon, err := sandbox.CanonicalJSON(sa)
	if err != nil {
		t.Fatal(err)
	}
	payload, _ := base64.StdEncoding.DecodeString(ea.Payload)
	if !bytes.Equal(canon, payload) {
		t.Errorf("payload is not canonical JSON:\n got %s\nwant %s", payload, canon)
	}
	envCanon, err := sandbox.CanonicalEnvelope(ea)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(envCanon, a) {
		t.Errorf("envelope is not canonical JSON:\n got %s\nwant %s", a, envCanon)
	}
}

func TestSignRefusesBadInput(t *testing.T) {
	s := signer(t)
	job := testJob(t, "job-1")
	other := testJob(t, "job-2")
	acc, err := s.SignAccepted(job, testFacts, testAt)
	if err != nil {
		t.Fatal(err)
	}
	unsealed := job
	unsealed.Digest = ""
	altered := job
	altered.Argv = []string{"/bin/false"}
	res := testResult(job)
	wrongDigest := res
	wrongDigest.ReceiptDigest = sandbox.DigestBytes([]byte("x"))
	badStatus := res
	badStatus.Status = "great"

	tests := []struct {
		name string
		sign func() ([]byte, error)
	}{
		{"unsealed job", func() ([]byte, error) { return s.SignAccepted(unsealed, testFacts, testAt) }},
		{"job altered after sealing", func() ([]byte, error) { return s.SignAccepted(altered, testFacts, testAt) }},
		{"zero accept time", func() ([]byte, error) { return s.SignAccepted(job, testFacts, time.Time{}) }},
		{"result names another receipt", func() ([]byte, error) { return s.SignCompleted(wrongDigest, acc) }},
		{"receipt of another job", func() ([]byte, error) { return s.SignCompleted(testResult(other), acc) }},
		{"invalid result", func() ([]byte, error) { return s.SignCompleted(badStatus, acc) }},
		{"not an envelope", func() ([]byte, error) { return s.SignCompleted(res, []byte("{}")) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, err := tt.sign()
			if err == nil {
				t.Fatalf("got an envelope (%d bytes), want an error", len(env))
			}
			if !errors.Is(err, sandbox.ErrInvalid) && !errors.Is(err, sandbox.ErrMalformedEnvelope) {
				t.Errorf("got %v, want sandbox.ErrInvalid or ErrMalformedEnvelope", err)
			}
		})
	}
}

func TestSignCompletedChainsToReceipt(t *testing.T) {
	s := signer(t)
	job := testJob(t, "job-1")
	acc, err := s.SignAccepted(job, testFacts, testAt)
	if err != nil {
		t.Fatal(err)
	}
	want := sandbox.DigestBytes(acc) // the envelope as stored is canonical
	comp, err := s.SignCompleted(testResult(job), acc)
	if err != nil {
		t.Fatal(err)
	}
	_, st := decodeEnvelope(t, comp)
	var c sandbox.Completion
	if err := json.Unmarshal(st.Predicate, &c); err != nil {
		t.Fatal(err)
	}
	if c.ReceiptDigest != want || c.Result.ReceiptDigest != want {
		t.Errorf("receipt digests: got %s and %s, want %s", c.ReceiptDigest, c.Result.ReceiptDigest, want)
	}
	if st.Subject[0].Name != sandbox.OutputsManifestName {
		t.Errorf("first subject: got %q, want %q", st.Subject[0].Name, sandbox.OutputsManifestName)
	}
	// A result with nothing collected still has a subject.
	empty := testResult(job)
	empty.Artifacts = nil
	comp, err = s.SignCompleted(empty, acc)
	if err != nil {
		t.Fatal(err)
	}
	_, st = decodeEnvelope(t, comp)
	wantManifest := strings.TrimPrefix(sandbox.DigestBytes([]byte("[]")), "sha256:")
	if len(st.Subject) != 1 || st.Subject[0].Digest["sha256"] != wantManifest {
		t.Errorf("subjects of an empty result: got %+v, want only outputs.json with the digest of []", st.Subject)
	}
}

func TestEphemeralSignerSaysSo(t *testing.T) {
	s, err := NewEphemeralSigner()
	if err != nil {
		t.Fatal(err)
	}
	if !s.Ephemeral() {
		t.Fatal("Ephemeral: got false, want true")
	}
	env, err := s.WithName("host-a").SignAccepted(testJob(t, "job-1"), testFacts, testAt)
	if err != nil {
		t.Fatal(err)
	}
	_, st := decodeEnvelope(t, env)
	var r sandbox.Receipt
	if err := json.Unmarshal(st.Predicate, &r); err != nil {
		t.Fatal(err)
	}
	if !r.Broker.EphemeralKey || r.Broker.Name != "host-a" {
		t.Errorf("broker: got %+v, want ephemeral_key true and name host-a", r.Broker)
	}
	if signer(t).Ephemeral() {
		t.Errorf("a loaded key reports Ephemeral")
	}
}

// TestOpenSSLVerifiesSignature checks the signature with a verifier that
// shares no code with ours: openssl over the DSSE PAE.
func TestOpenSSLVerifiesSignature(t *testing.T) {
	openssl, err := exec.LookPath("openssl")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("openssl not found: %v", err)
		}
		t.Skip("openssl not installed")
	}
	s := signer(t)
	env, err := s.SignAccepted(testJob(t, "job-1"), testFacts, testAt)
	if err != nil {
		t.Fatal(err)
	}
	e, _ := decodeEnvelope(t, env)
	payload, _ := base64.StdEncoding.DecodeString(e.Payload)
	sig, _ := base64.StdEncoding.DecodeString(e.Signatures[0].Sig)
	dir := t.TempDir()
	pae := sandbox.PAE(e.PayloadType, payload)
	if want := ssldsse.PAE(e.PayloadType, payload); !bytes.Equal(pae, want) {
		t.Fatalf("sandbox.PAE differs from securesystemslib's:\n got %q\nwant %q", pae, want)
	}
	tampered := bytes.Clone(pae)
	tampered[len(tampered)-2] ^= 1
	for name, b := range map[string][]byte{"broker.pub": s.PublicKeyPEM(), "sig.der": sig, "pae.bin": pae, "tampered.bin": tampered} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	run := func(data string) (string, error) {
		cmd := exec.Command(openssl, "dgst", "-sha256", "-verify", "broker.pub", "-signature", "sig.der", data)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if out, err := run("pae.bin"); err != nil || out != "Verified OK" {
		t.Errorf("openssl on the PAE: got %q (%v), want Verified OK", out, err)
	}
	if out, err := run("tampered.bin"); err == nil || strings.Contains(out, "Verified OK") {
		t.Errorf("openssl on a tampered PAE: got %q (%v), want a verification failure", out, err)
	}
}

func BenchmarkSignAccepted(b *testing.B) {
	s := signer(b)
	job := testJob(b, "job-1")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.SignAccepted(job, testFacts, testAt); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSignCompleted(b *testing.B) {
	s := signer(b)
	job := testJob(b, "job-1")
	acc, err := s.SignAccepted(job, testFacts, testAt)
	if err != nil {
		b.Fatal(err)
	}
	res := testResult(job)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.SignCompleted(res, acc); err != nil {
			b.Fatal(err)
		}
	}
}

// TestNoEngineClient: signing must not link the container engine client.
func TestNoEngineClient(t *testing.T) {
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(goBin, "list", "-deps", "github.com/sandboxd/sandboxd/internal/receipt").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps: got %d packages, want the real dependency list", len(deps))
	}
	for _, d := range deps {
		for _, banned := range []string{"github.com/moby/", "github.com/docker/", "github.com/sandboxd/sandboxd/internal/broker"} {
			if strings.HasPrefix(d, banned) {
				t.Errorf("internal/receipt depends on %s", d)
			}
		}
	}
}

// What the signer makes of a result is never more than sandbox.ResultSize
// says, nor more than the worst case for its number of artifacts, signed
// by two keys as during a rotation; and it never signs more than
// sandbox.MaxResultBytes.
func TestSignCompletedStaysWithinTheBound(t *testing.T) {
	other, err := NewEphemeralSigner()
	if err != nil {
		t.Fatal(err)
	}
	s, err := signer(t).WithName(strings.Repeat("n", 64)).AlsoSignWith(other)
	if err != nil {
		t.Fatal(err)
	}
	job := testJob(t, "job-1")
	acc, err := s.SignAccepted(job, testFacts, testAt)
	if err != nil {
		t.Fatal(err)
	}
	res := testResult(job)
	res.ReceiptDigest = sandbox.DigestBytes(acc)
	res.Artifacts = nil
	for i := range 300 {
		prefix := fmt.Sprintf("/work/out/%03d/", i)
		res.Artifacts = append(res.Artifacts, sandbox.Artifact{
			Path:   prefix + strings.Repeat(`"`, sandbox.MaxArtifactPathBytes-len(prefix)),
			Digest: sandbox.DigestBytes([]byte{byte(i)}), Size: 1<<63 - 1, MediaType: "application/octet-stream",
		})
	}
	env, err := s.SignCompleted(res, acc)
	if err != nil {
		t.Fatal(err)
	}
	size, err := sandbox.ResultSize(res)
	if err != nil {
		t.Fatal(err)
	}
	bound := sandbox.ResultBound(sandbox.Limits{FileCount: int64(len(res.Artifacts))})
	if int64(len(env)) > size || size > bound {
		t.Errorf("%d artifacts: signed %d bytes, ResultSize %d, ResultBound %d: want each at most the next", len(res.Artifacts), len(env), size, bound)
	}

	low := *s
	low.maxResult = len(env) - 1 // the same result, over a bound just below it
	if env, err := low.SignCompleted(res, acc); !errors.Is(err, sandbox.ErrTooLarge) {
		t.Fatalf("a result over the bound: got %d bytes and %v, want an error matching sandbox.ErrTooLarge", len(env), err)
	}
	low.maxResult = len(env)
	if _, err := low.SignCompleted(res, acc); err != nil {
		t.Fatalf("a result at the bound: %v", err)
	}
}
