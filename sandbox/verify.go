package sandbox

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/pem"
	"fmt"
	"slices"
)

// VerifyCheck names the verification step that rejected an envelope.
type VerifyCheck string

const (
	CheckMalformed      VerifyCheck = "malformed_envelope" // not a DSSE envelope, bad base64, undecodable statement
	CheckNoSignatures   VerifyCheck = "no_signatures"      // the envelope carries no signature at all
	CheckPayloadType    VerifyCheck = "payload_type"       // payloadType is not InTotoPayloadType
	CheckSignature      VerifyCheck = "signature"          // a signature by a pinned key does not verify
	CheckUnknownKey     VerifyCheck = "unknown_key"        // no signature is by a pinned key (the wrong key)
	CheckKeyIDMismatch  VerifyCheck = "key_id_mismatch"    // a pinned key's signature carries another key's id
	CheckStatementType  VerifyCheck = "statement_type"     // "_type" is not StatementType
	CheckPredicateType  VerifyCheck = "predicate_type"     // not the predicate type asked for
	CheckPredicate      VerifyCheck = "predicate"          // the predicate is malformed or inconsistent
	CheckSubject        VerifyCheck = "subject"            // the subjects do not match the predicate
	CheckJobBinding     VerifyCheck = "job_binding"        // the envelope is about another job
	CheckReceiptBinding VerifyCheck = "receipt_binding"    // the result is chained to another receipt
)

// VerifyError says which check rejected an envelope. errors.Is matches it
// against the sentinel of the same check (ErrSignature, …), so callers can
// branch without parsing messages.
type VerifyError struct {
	Check  VerifyCheck
	Detail string
}

func (e *VerifyError) Error() string { return "verify: " + e.Reason() }

// Reason is the message without its "verify: " prefix: the check that
// failed, then the detail, e.g. "signature: …".
func (e *VerifyError) Reason() string {
	if e.Detail == "" {
		return string(e.Check)
	}
	return string(e.Check) + ": " + e.Detail
}

// Is reports whether target is the sentinel of the same check.
func (e *VerifyError) Is(target error) bool {
	t, ok := target.(*VerifyError)
	return ok && t.Detail == "" && t.Check == e.Check
}

// Sentinels, one per check.
var (
	ErrMalformedEnvelope = &VerifyError{Check: CheckMalformed}
	ErrNoSignatures      = &VerifyError{Check: CheckNoSignatures}
	ErrPayloadType       = &VerifyError{Check: CheckPayloadType}
	ErrSignature         = &VerifyError{Check: CheckSignature}
	ErrUnknownKey        = &VerifyError{Check: CheckUnknownKey}
	ErrKeyIDMismatch     = &VerifyError{Check: CheckKeyIDMismatch}
	ErrStatementType     = &VerifyError{Check: CheckStatementType}
	ErrPredicateType     = &VerifyError{Check: CheckPredicateType}
	ErrPredicate         = &VerifyError{Check: CheckPredicate}
	ErrSubject           = &VerifyError{Check: CheckSubject}
	ErrJobBinding        = &VerifyError{Check: CheckJobBinding}
	ErrReceiptBinding    = &VerifyError{Check: CheckReceiptBinding}
)

func verifyErr(c VerifyCheck, format string, args ...any) error {
	return &VerifyError{Check: c, Detail: fmt.Sprintf(format, args...)}
}

// KeySet is a set of pinned broker public keys (ECDSA P-256), several during
// a key rotation. The zero KeySet pins nothing and verifies nothing.
type KeySet struct {
	keys []pinnedKey
}

type pinnedKey struct {
	id  string
	pub *ecdsa.PublicKey
}

// ParseKeySet reads "PUBLIC KEY" PEM blocks (PKIX, as cosign and
// `sandboxd keygen` write them); each argument holds one or more. Anything
// else in the input, a key that is not ECDSA P-256, or no key at all is an
// error that wraps ErrInvalid.
func ParseKeySet(pems ...[]byte) (KeySet, error) {
	var ks KeySet
	for i, data := range pems {
		rest := bytes.TrimSpace(data)
		n := 0
		for len(rest) > 0 {
			block, r := pem.Decode(rest)
			if block == nil {
				return KeySet{}, fmt.Errorf("public key %d: %w: not PEM (want a \"PUBLIC KEY\" block)", i+1, ErrInvalid)
			}
			rest = bytes.TrimSpace(r)
			n++
			if block.Type != "PUBLIC KEY" {
				return KeySet{}, fmt.Errorf("public key %d: %w: PEM block %q is not a \"PUBLIC KEY\"", i+1, ErrInvalid, block.Type)
			}
			parsed, err := x509.ParsePKIXPublicKey(block.Bytes)
			if err != nil {
				return KeySet{}, fmt.Errorf("public key %d: %w: %w", i+1, ErrInvalid, err)
			}
			pub, ok := parsed.(*ecdsa.PublicKey)
			if !ok || pub.Curve != elliptic.P256() {
				return KeySet{}, fmt.Errorf("public key %d: %w: unsupported key type %s (want ECDSA P-256)", i+1, ErrInvalid, keyTypeName(parsed))
			}
			id, err := KeyID(pub)
			if err != nil {
				return KeySet{}, fmt.Errorf("public key %d: %w", i+1, err)
			}
			if !slices.ContainsFunc(ks.keys, func(k pinnedKey) bool { return k.id == id }) {
				ks.keys = append(ks.keys, pinnedKey{id: id, pub: pub})
			}
		}
		if n == 0 {
			return KeySet{}, fmt.Errorf("public key %d: %w: empty", i+1, ErrInvalid)
		}
	}
	if len(ks.keys) == 0 {
		return KeySet{}, fmt.Errorf("key set: %w: no public key given", ErrInvalid)
	}
	return ks, nil
}

func keyTypeName(k any) string {
	if ec, ok := k.(*ecdsa.PublicKey); ok {
		return "ECDSA " + ec.Curve.Params().Name
	}
	return fmt.Sprintf("%T", k)
}

// KeyIDs returns the key ids of the pinned keys, in the order given.
func (ks KeySet) KeyIDs() []string {
	ids := make([]string, len(ks.keys))
	for i, k := range ks.keys {
		ids[i] = k.id
	}
	return ids
}

// KeyID returns the DSSE key id of pub: "SHA256:" and the unpadded base64
// SHA-256 of the key in SSH wire format, the fingerprint that `ssh-keygen
// -l` prints and go-securesystemslib's SHA256KeyID computes. Verifiers that
// follow that convention skip a signature whose key id they do not know.
func KeyID(pub *ecdsa.PublicKey) (string, error) {
	if pub == nil || pub.Curve != elliptic.P256() {
		return "", fmt.Errorf("key id: %w: unsupported key (want ECDSA P-256)", ErrInvalid)
	}
	ek, err := pub.ECDH()
	if err != nil {
		return "", fmt.Errorf("key id: %w: %w", ErrInvalid, err)
	}
	var wire []byte
	for _, field := range [][]byte{[]byte("ecdsa-sha2-nistp256"), []byte("nistp256"), ek.Bytes()} {
		wire = binary.BigEndian.AppendUint32(wire, uint32(len(field)))
		wire = append(wire, field...)
	}
	sum := sha256.Sum256(wire)
	return "SHA256:" + base64.RawStdEncoding.EncodeToString(sum[:]), nil
}

// VerifiedEnvelope is what VerifyEnvelope proved: these payload bytes, of
// this type, were signed by the pinned keys listed.
type VerifiedEnvelope struct {
	PayloadType string
	Payload     []byte
	KeyIDs      []string
}

// VerifyEnvelope checks the signatures of a DSSE envelope of any payload
// type against the pinned keys.
//
// Key ids are taken at their word, never worked around: a signature whose
// key id names a pinned key is checked with that key only, and if it does
// not verify the envelope is rejected (ErrSignature) even when another
// signature verifies. A signature whose key id names no pinned key is
// skipped — that is how an envelope signed by an old and a new key verifies
// with either pinned alone — unless a pinned key does verify it, in which
// case the key id lies and the envelope is rejected (ErrKeyIDMismatch). A
// signature without a key id is tried against every pinned key. The
// envelope is valid only if at least one signature verified and none was
// rejected; if every signature was skipped the error is ErrUnknownKey.
func VerifyEnvelope(keys KeySet, envelope []byte) (VerifiedEnvelope, error) {
	env, payload, err := parseEnvelope(envelope)
	if err != nil {
		return VerifiedEnvelope{}, err
	}
	ids, err := verifySignatures(keys, env, payload)
	if err != nil {
		return VerifiedEnvelope{}, err
	}
	return VerifiedEnvelope{PayloadType: env.PayloadType, Payload: payload, KeyIDs: ids}, nil
}

func parseEnvelope(envelope []byte) (Envelope, []byte, error) {
	var env Envelope
	if err := decodeStrict(envelope, &env); err != nil {
		return Envelope{}, nil, verifyErr(CheckMalformed, "not a DSSE envelope: %v", err)
	}
	payload, err := decodeB64(env.Payload)
	if err != nil {
		return Envelope{}, nil, verifyErr(CheckMalformed, "payload: %v", err)
	}
	if len(env.Signatures) == 0 {
		return Envelope{}, nil, verifyErr(CheckNoSignatures, "the envelope carries no signature")
	}
	return env, payload, nil
}

func verifySignatures(keys KeySet, env Envelope, payload []byte) ([]string, error) {
	if len(keys.keys) == 0 {
		return nil, verifyErr(CheckUnknownKey, "no key is pinned")
	}
	digest := sha256.Sum256(PAE(env.PayloadType, payload))
	verifiesWith := func(sig []byte) (string, bool) {
		for _, k := range keys.keys {
			if ecdsa.VerifyASN1(k.pub, digest[:], sig) {
				return k.id, true
			}
		}
		return "", false
	}
	var verified, skipped []string
	for i, s := range env.Signatures {
		sig, err := decodeB64(s.Sig)
		if err != nil {
			return nil, verifyErr(CheckMalformed, "signature %d: %v", i+1, err)
		}
		if s.KeyID == "" {
			id, ok := verifiesWith(sig)
			if !ok {
				skipped = append(skipped, "(no key id)")
				continue
			}
			if !slices.Contains(verified, id) {
				verified = append(verified, id)
			}
			continue
		}
		k := slices.IndexFunc(keys.keys, func(k pinnedKey) bool { return k.id == s.KeyID })
		if k >= 0 {
			if !ecdsa.VerifyASN1(keys.keys[k].pub, digest[:], sig) {
				if other, ok := verifiesWith(sig); ok {
					return nil, verifyErr(CheckKeyIDMismatch, "signature %d names key %s but was made by pinned key %s", i+1, s.KeyID, other)
				}
				return nil, verifyErr(CheckSignature, "signature %d by pinned key %s does not verify", i+1, s.KeyID)
			}
			if !slices.Contains(verified, s.KeyID) {
				verified = append(verified, s.KeyID)
			}
			continue
		}
		if other, ok := verifiesWith(sig); ok {
			return nil, verifyErr(CheckKeyIDMismatch, "signature %d names key %s but was made by pinned key %s", i+1, s.KeyID, other)
		}
		skipped = append(skipped, s.KeyID)
	}
	if len(verified) == 0 {
		if slices.Contains(skipped, "(no key id)") {
			return nil, verifyErr(CheckSignature, "no signature verifies with a pinned key (signatures without key id: tried every pinned key)")
		}
		return nil, verifyErr(CheckUnknownKey, "signed by %v; pinned %v", skipped, keys.KeyIDs())
	}
	return verified, nil
}

// Attestation is a verified receipt or result: the signatures hold, the
// statement is well formed and its subjects agree with its predicate. It is
// not yet bound to any job the caller knows; see CheckJob.
type Attestation struct {
	PredicateType string
	Subjects      []Subject
	// KeyIDs are the pinned keys whose signatures verified.
	KeyIDs []string
	// Digest is EnvelopeDigest of the envelope.
	Digest string
	// Exactly one of Receipt (PredicateAccepted) and Completion
	// (PredicateCompleted) is set.
	Receipt    *Receipt
	Completion *Completion
}

// JobID and JobDigest name the job the attestation is about.
func (a *Attestation) JobID() string {
	if a.Receipt != nil {
		return a.Receipt.Job.ID
	}
	return a.Completion.Result.JobID
}

// JobDigest is the digest of the job the attestation is about.
func (a *Attestation) JobDigest() string {
	if a.Receipt != nil {
		return a.Receipt.Job.Digest
	}
	return a.Completion.Result.JobDigest
}

// CheckJob reports (ErrJobBinding) whether the attestation is about job.
// job must be sealed and its digest must match its content.
func (a *Attestation) CheckJob(job Job) error {
	if err := job.VerifyDigest(); err != nil {
		return fmt.Errorf("job to bind to: %w", err)
	}
	if a.JobID() != job.ID || a.JobDigest() != job.Digest {
		return verifyErr(CheckJobBinding, "envelope is about job %q (%s), not %q (%s)", a.JobID(), a.JobDigest(), job.ID, job.Digest)
	}
	return nil
}

// VerifyAttestation checks, in this order: the envelope's form, that it has
// signatures, its payload type, its signatures (see VerifyEnvelope), the
// statement type, the predicate type (accepted or completed), the predicate
// (strictly decoded: a receipt's job must be sealed and hash to its digest;
// a result must validate and carry the same receipt digest as its
// predicate) and finally that the subjects are exactly the ones the
// predicate implies (ReceiptSubjects, ResultSubjects).
func VerifyAttestation(keys KeySet, envelope []byte) (Attestation, error) {
	env, payload, err := parseEnvelope(envelope)
	if err != nil {
		return Attestation{}, err
	}
	if env.PayloadType != InTotoPayloadType {
		return Attestation{}, verifyErr(CheckPayloadType, "%q, want %q", env.PayloadType, InTotoPayloadType)
	}
	ids, err := verifySignatures(keys, env, payload)
	if err != nil {
		return Attestation{}, err
	}
	canon, err := CanonicalEnvelope(env)
	if err != nil {
		return Attestation{}, verifyErr(CheckMalformed, "envelope: %v", err)
	}
	digest := DigestBytes(canon) // EnvelopeDigest, without parsing again
	var st Statement
	if err := decodeStrict(payload, &st); err != nil {
		return Attestation{}, verifyErr(CheckMalformed, "statement: %v", err)
	}
	if st.Type != StatementType {
		return Attestation{}, verifyErr(CheckStatementType, "%q, want %q", st.Type, StatementType)
	}
	att := Attestation{PredicateType: st.PredicateType, Subjects: st.Subject, KeyIDs: ids, Digest: digest}
	var want []Subject
	switch st.PredicateType {
	case PredicateAccepted:
		var r Receipt
		if err := decodeStrict(st.Predicate, &r); err != nil {
			return Attestation{}, verifyErr(CheckPredicate, "accepted: %v", err)
		}
		if err := r.Job.VerifyDigest(); err != nil {
			return Attestation{}, verifyErr(CheckPredicate, "accepted: %v", err)
		}
		if r.AcceptedAt.IsZero() {
			return Attestation{}, verifyErr(CheckPredicate, "accepted: no accepted_at")
		}
		if want, err = ReceiptSubjects(r.Job); err != nil {
			return Attestation{}, verifyErr(CheckPredicate, "accepted: %v", err)
		}
		att.Receipt = &r
	case PredicateCompleted:
		var c Completion
		if err := decodeStrict(st.Predicate, &c); err != nil {
			return Attestation{}, verifyErr(CheckPredicate, "completed: %v", err)
		}
		if err := c.Result.Validate(); err != nil {
			return Attestation{}, verifyErr(CheckPredicate, "completed: %v", err)
		}
		if !ValidDigest(c.ReceiptDigest) || c.Result.ReceiptDigest != c.ReceiptDigest {
			return Attestation{}, verifyErr(CheckPredicate, "completed: receipt_digest %q and result.receipt_digest %q must be the same digest", c.ReceiptDigest, c.Result.ReceiptDigest)
		}
		if want, err = ResultSubjects(c.Result); err != nil {
			return Attestation{}, verifyErr(CheckPredicate, "completed: %v", err)
		}
		att.Completion = &c
	default:
		return Attestation{}, verifyErr(CheckPredicateType, "%q is neither %q nor %q", st.PredicateType, PredicateAccepted, PredicateCompleted)
	}
	if err := sameSubjects(st.Subject, want); err != nil {
		return Attestation{}, err
	}
	return att, nil
}

func sameSubjects(got, want []Subject) error {
	if len(got) != len(want) {
		return verifyErr(CheckSubject, "%d subjects, want %d", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Name != w.Name || len(g.Digest) != len(w.Digest) || g.Digest["sha256"] != w.Digest["sha256"] {
			return verifyErr(CheckSubject, "subject %d is %s %v, want %s %v", i+1, g.Name, g.Digest, w.Name, w.Digest)
		}
	}
	return nil
}

// VerifyReceipt verifies a signed receipt (VerifyAttestation) and that it is
// the receipt of job: accepted, for job's id and digest.
func VerifyReceipt(keys KeySet, envelope []byte, job Job) (Receipt, error) {
	att, err := VerifyAttestation(keys, envelope)
	if err != nil {
		return Receipt{}, err
	}
	if att.Receipt == nil {
		return Receipt{}, verifyErr(CheckPredicateType, "%q, want %q", att.PredicateType, PredicateAccepted)
	}
	if err := att.CheckJob(job); err != nil {
		return Receipt{}, err
	}
	return *att.Receipt, nil
}

// VerifyResult verifies a signed result (VerifyAttestation), that it is
// about job, that it is chained to receiptEnvelope (its receipt digest is
// EnvelopeDigest(receiptEnvelope)), and that receiptEnvelope is a valid
// receipt for job under the same keys.
func VerifyResult(keys KeySet, envelope []byte, job Job, receiptEnvelope []byte) (Result, error) {
	att, err := VerifyAttestation(keys, envelope)
	if err != nil {
		return Result{}, err
	}
	if att.Completion == nil {
		return Result{}, verifyErr(CheckPredicateType, "%q, want %q", att.PredicateType, PredicateCompleted)
	}
	if err := att.CheckJob(job); err != nil {
		return Result{}, err
	}
	rd, err := EnvelopeDigest(receiptEnvelope)
	if err != nil {
		return Result{}, verifyErr(CheckReceiptBinding, "receipt: %v", err)
	}
	if rd != att.Completion.ReceiptDigest {
		return Result{}, verifyErr(CheckReceiptBinding, "result is chained to receipt %s, the receipt given is %s", att.Completion.ReceiptDigest, rd)
	}
	if _, err := VerifyReceipt(keys, receiptEnvelope, job); err != nil {
		return Result{}, fmt.Errorf("receipt: %w", err)
	}
	return att.Completion.Result, nil
}
