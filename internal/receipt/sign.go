package receipt

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	ssldsse "github.com/secure-systems-lab/go-securesystemslib/dsse"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/sigstore/sigstore/pkg/signature/dsse"

	"github.com/sandboxd/sandboxd/sandbox"
)

// DefaultBrokerName is the broker name envelopes carry unless WithName
// sets another.
const DefaultBrokerName = "sandboxd"

// Signer signs receipts and results with one key, or with several during a
// key rotation (see AlsoSignWith). It is safe for concurrent use.
type Signer struct {
	name string
	keys []signingKey // keys[0] is the primary: its id and kind go in the predicate
	dsse signature.Signer
	// maxResult bounds a signed result (0: sandbox.MaxResultBytes); tests
	// lower it.
	maxResult int
}

type signingKey struct {
	sv        signature.SignerVerifier
	pubPEM    []byte
	keyID     string
	ephemeral bool
}

func newSigner(priv *ecdsa.PrivateKey, ephemeral bool) (*Signer, error) {
	sv, err := signature.LoadECDSASignerVerifier(priv, crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("load signer: %w", err)
	}
	pubPEM, err := cryptoutils.MarshalPublicKeyToPEM(priv.Public())
	if err != nil {
		return nil, fmt.Errorf("encode public key: %w", err)
	}
	id, err := ssldsse.SHA256KeyID(priv.Public())
	if err != nil {
		return nil, fmt.Errorf("key id: %w", err)
	}
	return assemble(DefaultBrokerName, []signingKey{{sv: sv, pubPEM: pubPEM, keyID: id, ephemeral: ephemeral}})
}

func assemble(name string, keys []signingKey) (*Signer, error) {
	svs := make([]signature.Signer, len(keys))
	for i, k := range keys {
		svs[i] = k.sv
	}
	// WrapMultiSigner labels each signature with go-securesystemslib's
	// SHA256KeyID, the "SHA256:" form standard DSSE verifiers match on.
	w := dsse.WrapMultiSigner(sandbox.InTotoPayloadType, svs...)
	if w == nil {
		return nil, errors.New("dsse signer: a key has no public key")
	}
	return &Signer{name: name, keys: keys, dsse: w}, nil
}

// WithName returns a copy of s that names the broker name in envelopes.
func (s *Signer) WithName(name string) *Signer {
	c := *s
	c.name = name
	return &c
}

// AlsoSignWith returns a signer that signs every envelope with s's keys and
// then with others' keys, for key rotation: verifiers that pin either the
// old or the new key accept the envelopes. The predicate names s's first key.
func (s *Signer) AlsoSignWith(others ...*Signer) (*Signer, error) {
	keys := append([]signingKey(nil), s.keys...)
	for _, o := range others {
		for _, k := range o.keys {
			dup := false
			for _, have := range keys {
				dup = dup || have.keyID == k.keyID
			}
			if !dup {
				keys = append(keys, k)
			}
		}
	}
	return assemble(s.name, keys)
}

// PublicKeyPEM returns the primary public key as a PKIX "PUBLIC KEY" PEM.
func (s *Signer) PublicKeyPEM() []byte { return bytes.Clone(s.keys[0].pubPEM) }

// KeyID returns the primary key's DSSE key id ("SHA256:…").
func (s *Signer) KeyID() string { return s.keys[0].keyID }

// Ephemeral reports whether the primary key exists only in memory.
func (s *Signer) Ephemeral() bool { return s.keys[0].ephemeral }

func (s *Signer) broker(version string) sandbox.BrokerIdentity {
	return sandbox.BrokerIdentity{Name: s.name, KeyID: s.KeyID(), Version: version, EphemeralKey: s.Ephemeral()}
}

// SignAccepted signs the receipt of a sealed job accepted at the given time
// (kept in UTC). The payload is a pure function of the arguments and the
// signer's identity; only the ECDSA signatures differ from call to call, so
// a broker that must answer a resubmission with the same receipt stores
// the bytes.
func (s *Signer) SignAccepted(job sandbox.Job, facts sandbox.RuntimeFacts, at time.Time) ([]byte, error) {
	if err := job.VerifyDigest(); err != nil {
		return nil, fmt.Errorf("sign accepted: %w", err)
	}
	if at.IsZero() {
		return nil, fmt.Errorf("sign accepted: %w: zero accept time", sandbox.ErrInvalid)
	}
	// Encode the job the way its digest was computed (empty collections as
	// [] and {}), so the receipt shows exactly what was hashed.
	canonJob, err := job.CanonicalJSON()
	if err != nil {
		return nil, fmt.Errorf("sign accepted: %w", err)
	}
	var norm sandbox.Job
	if err := json.Unmarshal(canonJob, &norm); err != nil {
		return nil, fmt.Errorf("sign accepted: %w", err)
	}
	job = norm
	subjects, err := sandbox.ReceiptSubjects(job)
	if err != nil {
		return nil, fmt.Errorf("sign accepted: %w", err)
	}
	pred := sandbox.Receipt{
		Job:        job,
		Broker:     s.broker(facts.BrokerVersion),
		Runtime:    facts,
		AcceptedAt: at.UTC(),
	}
	return s.signStatement(sandbox.PredicateAccepted, subjects, pred)
}

// SignCompleted signs the result of the job whose receipt is
// receiptEnvelope. It sets res.ReceiptDigest to the receipt's
// EnvelopeDigest (a different non-empty value is an error) and refuses a
// receipt that is not the accepted statement of res's job, and a result
// whose envelope would be over sandbox.MaxResultBytes (sandbox.ErrTooLarge).
// The receipt's signatures are not checked here: the broker signed it
// itself.
func (s *Signer) SignCompleted(res sandbox.Result, receiptEnvelope []byte) ([]byte, error) {
	digest, err := sandbox.EnvelopeDigest(receiptEnvelope)
	if err != nil {
		return nil, fmt.Errorf("sign completed: receipt: %w", err)
	}
	if err := receiptIsFor(receiptEnvelope, res); err != nil {
		return nil, fmt.Errorf("sign completed: %w", err)
	}
	if res.ReceiptDigest != "" && res.ReceiptDigest != digest {
		return nil, fmt.Errorf("sign completed: %w: result names receipt %s, the receipt given is %s", sandbox.ErrInvalid, res.ReceiptDigest, digest)
	}
	res.ReceiptDigest = digest
	if err := res.Validate(); err != nil {
		return nil, fmt.Errorf("sign completed: %w", err)
	}
	subjects, err := sandbox.ResultSubjects(res)
	if err != nil {
		return nil, fmt.Errorf("sign completed: %w", err)
	}
	pred := sandbox.Completion{Result: res, ReceiptDigest: digest, Broker: s.broker(res.Runtime.BrokerVersion)}
	env, err := s.signStatement(sandbox.PredicateCompleted, subjects, pred)
	if err != nil {
		return nil, err
	}
	// The broker keeps results within the bound (its jobs' limits, and
	// its own guard): a larger one is a bug, never handed to anyone.
	max := s.maxResult
	if max == 0 {
		max = sandbox.MaxResultBytes
	}
	if len(env) > max {
		return nil, fmt.Errorf("sign completed: result of job %s: %w: %d bytes signed, more than the %d of any result (sandbox.MaxResultBytes)", res.JobID, sandbox.ErrTooLarge, len(env), max)
	}
	return env, nil
}

func receiptIsFor(receiptEnvelope []byte, res sandbox.Result) error {
	var env sandbox.Envelope
	if err := json.Unmarshal(receiptEnvelope, &env); err != nil {
		return fmt.Errorf("%w: receipt: %w", sandbox.ErrInvalid, err)
	}
	var st sandbox.Statement
	if err := unmarshalB64JSON(env.Payload, &st); err != nil {
		return fmt.Errorf("%w: receipt: %w", sandbox.ErrInvalid, err)
	}
	if st.PredicateType != sandbox.PredicateAccepted {
		return fmt.Errorf("%w: receipt has predicate type %q, want %q", sandbox.ErrInvalid, st.PredicateType, sandbox.PredicateAccepted)
	}
	var r sandbox.Receipt
	if err := json.Unmarshal(st.Predicate, &r); err != nil {
		return fmt.Errorf("%w: receipt predicate: %w", sandbox.ErrInvalid, err)
	}
	if r.Job.ID != res.JobID || r.Job.Digest != res.JobDigest {
		return fmt.Errorf("%w: receipt is for job %q (%s), result for %q (%s)", sandbox.ErrInvalid, r.Job.ID, r.Job.Digest, res.JobID, res.JobDigest)
	}
	return nil
}

func unmarshalB64JSON(b64 string, v any) error {
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return fmt.Errorf("payload: %w", err)
	}
	return json.Unmarshal(raw, v)
}

// SignStatement signs an arbitrary in-toto statement with sandboxd's
// envelope rules (canonical payload, canonical envelope). Receipts and
// results go through SignAccepted and SignCompleted; this exists for tests
// and tools that need a well-signed statement of another shape.
func (s *Signer) SignStatement(st sandbox.Statement) ([]byte, error) {
	payload, err := sandbox.CanonicalJSON(st)
	if err != nil {
		return nil, fmt.Errorf("encode statement: %w", err)
	}
	return s.SignPayload(payload)
}

func (s *Signer) signStatement(predicateType string, subjects []sandbox.Subject, predicate any) ([]byte, error) {
	pred, err := sandbox.CanonicalJSON(predicate)
	if err != nil {
		return nil, fmt.Errorf("encode predicate: %w", err)
	}
	return s.SignStatement(sandbox.Statement{
		Type:          sandbox.StatementType,
		Subject:       subjects,
		PredicateType: predicateType,
		Predicate:     pred,
	})
}

// SignPayload wraps payload in a DSSE envelope of type
// sandbox.InTotoPayloadType signed by every key, and returns the envelope's
// canonical JSON (see sandbox.EnvelopeDigest).
func (s *Signer) SignPayload(payload []byte) ([]byte, error) {
	raw, err := s.dsse.SignMessage(bytes.NewReader(payload))
	if err != nil {
		return nil, fmt.Errorf("dsse sign: %w", err)
	}
	var env sandbox.Envelope
	if err := json.Unmarshal(raw, &env); err != nil {
		return nil, fmt.Errorf("dsse sign: %w", err)
	}
	return sandbox.CanonicalEnvelope(env)
}
