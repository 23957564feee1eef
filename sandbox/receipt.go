package sandbox

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// The formats of signed receipts and results. A receipt (job accepted) and
// a result (job completed) are each an in-toto Statement v1 carried in a
// DSSE envelope whose payload is the statement's canonical JSON.
const (
	// InTotoPayloadType is the DSSE payload type of every envelope.
	InTotoPayloadType = "application/vnd.in-toto+json"
	// StatementType is the in-toto Statement "_type".
	StatementType = "https://in-toto.io/Statement/v1"
	// PredicateAccepted is the predicate type of a receipt; its predicate
	// is a Receipt.
	PredicateAccepted = "https://sandboxd.dev/attestation/accepted/v1"
	// PredicateCompleted is the predicate type of a result; its predicate is
	// a Completion.
	PredicateCompleted = "https://sandboxd.dev/attestation/completed/v1"
	// PredicateTestResult is the predicate type of the supervisor's signed
	// verdict, an in-toto test-result statement
	// (https://github.com/in-toto/attestation/blob/main/spec/predicates/test-result.md)
	// whose result is TestResultPassed or TestResultFailed.
	PredicateTestResult = "https://in-toto.io/attestation/test-result/v0.1"
	// The results a test-result predicate can carry.
	TestResultPassed = "PASSED"
	TestResultWarned = "WARNED"
	TestResultFailed = "FAILED"
	// OutputsManifestName is the subject of a result that names the list of
	// collected artifacts, so that a result's subject list is never empty.
	OutputsManifestName = "outputs.json"
	// jobSubjectPrefix starts the name of a receipt's only subject.
	jobSubjectPrefix = "job:"
)

// Envelope is a DSSE envelope with the field names of the DSSE spec.
type Envelope struct {
	PayloadType string `json:"payloadType"`
	// Payload is the standard base64 encoding of the signed bytes.
	Payload    string      `json:"payload"`
	Signatures []Signature `json:"signatures"`
}

// Signature is one DSSE signature: an ASN.1 DER ECDSA signature over the
// SHA-256 of the pre-authentication encoding (PAE), base64 encoded, and the
// "SHA256:" fingerprint of the key that made it.
type Signature struct {
	KeyID string `json:"keyid"`
	Sig   string `json:"sig"`
}

// Statement is an in-toto Statement v1 with the spec's field names.
type Statement struct {
	Type          string          `json:"_type"`
	Subject       []Subject       `json:"subject"`
	PredicateType string          `json:"predicateType"`
	Predicate     json.RawMessage `json:"predicate"`
}

// Subject is an in-toto ResourceDescriptor reduced to the fields sandboxd
// writes. Digest maps an algorithm ("sha256") to lowercase hex.
type Subject struct {
	Name   string            `json:"name"`
	Digest map[string]string `json:"digest"`
}

// BrokerIdentity identifies the broker that signed an envelope.
type BrokerIdentity struct {
	Name    string `json:"name"`
	KeyID   string `json:"key_id"` // the signing key's "SHA256:" fingerprint
	Version string `json:"version"`
	// EphemeralKey is true when the broker ran with a key generated at
	// start-up: such envelopes prove nothing once the broker is gone.
	EphemeralKey bool `json:"ephemeral_key"`
}

// Receipt is the predicate of an accepted statement: what the broker durably
// accepted, under which runtime, and when.
type Receipt struct {
	Job        Job            `json:"job"`
	Broker     BrokerIdentity `json:"broker"`
	Runtime    RuntimeFacts   `json:"runtime"`
	AcceptedAt time.Time      `json:"accepted_at"`
}

// Completion is the predicate of a completed statement: the job's Result,
// chained to the receipt by ReceiptDigest (see EnvelopeDigest).
type Completion struct {
	Result        Result         `json:"result"`
	ReceiptDigest string         `json:"receipt_digest"`
	Broker        BrokerIdentity `json:"broker"`
}

// EnvelopeDigest returns the digest that chains a result to its receipt:
// the SHA-256 of the canonical JSON of the envelope, that is of the object
// {"payload","payloadType","signatures":[{"keyid","sig"}…]} with sorted keys
// and no white space. The signer emits envelopes in exactly that form, so
// the digest of stored envelope bytes is simply their SHA-256; a copy that
// was re-indented still yields the same digest, and one with any other
// field is refused. Signatures are covered: adding or dropping one changes
// the digest.
func EnvelopeDigest(envelope []byte) (string, error) {
	var env Envelope
	if err := decodeStrict(envelope, &env); err != nil {
		return "", verifyErr(CheckMalformed, "envelope: %v", err)
	}
	canon, err := CanonicalEnvelope(env)
	if err != nil {
		return "", err
	}
	return DigestBytes(canon), nil
}

// CanonicalEnvelope encodes env in the form EnvelopeDigest hashes.
func CanonicalEnvelope(env Envelope) ([]byte, error) {
	if env.Signatures == nil {
		env.Signatures = []Signature{}
	}
	return CanonicalJSON(env)
}

// ReceiptSubjects returns the subjects of a receipt for job: exactly one,
// named "job:<id>", with the job's digest.
func ReceiptSubjects(job Job) ([]Subject, error) {
	hex, ok := strings.CutPrefix(job.Digest, "sha256:")
	if !ok || !ValidDigest(job.Digest) {
		return nil, fieldErr("job.digest", "malformed digest %q", job.Digest)
	}
	return []Subject{{Name: jobSubjectPrefix + job.ID, Digest: map[string]string{"sha256": hex}}}, nil
}

// ResultSubjects returns the subjects of a result: the outputs manifest
// (named OutputsManifestName, the digest of OutputsManifest(res)) first,
// then every artifact in the result's order, named by its sandbox path.
func ResultSubjects(res Result) ([]Subject, error) {
	manifest, err := OutputsManifest(res)
	if err != nil {
		return nil, err
	}
	subjects := make([]Subject, 0, 1+len(res.Artifacts))
	subjects = append(subjects, Subject{
		Name:   OutputsManifestName,
		Digest: map[string]string{"sha256": strings.TrimPrefix(DigestBytes(manifest), "sha256:")},
	})
	for i, a := range res.Artifacts {
		hex, ok := strings.CutPrefix(a.Digest, "sha256:")
		if !ok || !ValidDigest(a.Digest) {
			return nil, fieldErr(fmt.Sprintf("result.artifacts[%d].digest", i), "malformed digest %q", a.Digest)
		}
		subjects = append(subjects, Subject{Name: a.Path, Digest: map[string]string{"sha256": hex}})
	}
	return subjects, nil
}

// OutputsManifest returns the canonical JSON of the result's artifact list
// ("[]" when nothing was collected).
func OutputsManifest(res Result) ([]byte, error) {
	arts := res.Artifacts
	if arts == nil {
		arts = []Artifact{}
	}
	return CanonicalJSON(arts)
}

// PAE returns the DSSE pre-authentication encoding that signatures cover:
// "DSSEv1 <len(type)> <type> <len(payload)> <payload>".
func PAE(payloadType string, payload []byte) []byte {
	head := fmt.Sprintf("DSSEv1 %d %s %d ", len(payloadType), payloadType, len(payload))
	out := make([]byte, 0, len(head)+len(payload))
	return append(append(out, head...), payload...)
}

// decodeB64 accepts the standard and the URL alphabet, padded or not, as
// the DSSE spec allows.
func decodeB64(s string) ([]byte, error) {
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil {
			return b, nil
		}
	}
	return nil, fmt.Errorf("not base64")
}
