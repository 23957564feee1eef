package sandbox

import "strings"

// MaxResultBytes bounds a signed result: the canonical DSSE envelope of its
// completed statement, as the broker signs it, the daemon journals and
// serves it and a client reads it. Its base64 payload carries each
// collected artifact twice (in result.artifacts and as a subject named by
// its path), so a job's file_count decides how large its result can get:
// Validate refuses limits whose worst case (ResultBound) is larger, the
// broker never lists an artifact that would take a result over it, the
// signer refuses a larger envelope and sandbox/client reads no more. It is
// what everything that holds a result in memory can rely on, and it fits
// MaxFileCount artifacts of the longest paths.
const MaxResultBytes = 128 << 20

// MaxArtifactPathBytes bounds the sandbox path of a collected artifact: a
// file whose path is longer, or has a control character, is not collected
// (the result lists it under rejected). It is the limit on a job's own
// paths, and the tree readers' default limit on a workspace's or an
// export's relative paths.
const MaxArtifactPathBytes = 1024

// MaxFileCount is the largest limits.file_count a job may have: the most
// artifacts whose signed result, at its worst, still fits MaxResultBytes.
const MaxFileCount = (maxResultPayload - resultFixedPayload) / maxArtifactPayload

// ResultBound returns the most bytes the signed result of a job with limits
// l can take (the envelope MaxResultBytes bounds): file_count artifacts,
// each at its largest in the encoded statement, and everything else at the
// largest the broker makes it. An artifact is at its largest with a path of
// MaxArtifactPathBytes that JSON escapes to twice its length (all quotes
// or backslashes: control characters and invalid UTF-8, the only bytes
// that escape to more, are in no artifact path: neither the job's outputs
// nor the helper's names may have them, and the broker refuses them).
func ResultBound(l Limits) int64 {
	return envelopeBytes(resultFixedPayload + max(l.FileCount, 0)*maxArtifactPayload)
}

// ResultSize returns at most how many bytes the signed envelope of res will
// take, allowing for the signer's part (its identity and signatures) as
// ResultBound does; the broker checks it against MaxResultBytes before the
// result is signed.
func ResultSize(res Result) (int64, error) {
	arts := res.Artifacts
	res.Artifacts = []Artifact{}
	// The canonical form is never longer than this encoding: the same
	// strings, numbers and keys (in another order), and invalid UTF-8, if
	// any, shrinks from an escape to a raw U+FFFD.
	rest, err := marshalNoEscape(res)
	if err != nil {
		return 0, err
	}
	n := int64(len(rest)) + statementPayload
	for _, a := range arts {
		b, err := artifactPayload(a)
		if err != nil {
			return 0, err
		}
		n += b
	}
	return envelopeBytes(n), nil
}

// artifactPayload is what one artifact adds to a result's statement: its
// entry in result.artifacts and its subject, each with a separator.
func artifactPayload(a Artifact) (int64, error) {
	entry, err := marshalNoEscape(a)
	if err != nil {
		return 0, err
	}
	subject, err := marshalNoEscape(Subject{Name: a.Path, Digest: map[string]string{"sha256": strings.TrimPrefix(a.Digest, "sha256:")}})
	if err != nil {
		return 0, err
	}
	return int64(len(entry) + len(subject) + 2), nil
}

// The parts of a signed result's size, in payload bytes (before base64)
// unless named otherwise.
const (
	// maxArtifactPayload is artifactPayload at its largest: a path of
	// MaxArtifactPathBytes escaped to twice that, a size of 19 digits (any
	// int64) and a media type of at most maxMediaTypeBytes.
	maxArtifactPayload = int64(len(`{"path":"","digest":"sha256:","size":,"media_type":""},`)+64+2*MaxArtifactPathBytes+19+maxMediaTypeBytes) +
		int64(len(`{"name":"","digest":{"sha256":""}},`)+2*MaxArtifactPathBytes+64)
	maxMediaTypeBytes = 64

	// statementPayload is the statement around the result: its type, the
	// predicate type, the outputs manifest's subject, the receipt digest,
	// and the signer's part (the broker's name of at most 64 bytes, its
	// key id and version, and the envelope's signatures: several keys
	// during a rotation), which the envelope's own framing joins.
	statementPayload = 16 << 10

	// resultFixedPayload is everything but the artifacts, at its largest:
	// the statement, and the result's other fields, most of them
	// fixed-size; what the sandbox writes reaches them only through the
	// broker's caps: the rejected list (1,026 entries of a path and a
	// reason of at most 1,027 bytes each, with no control character but
	// tab and newline: 4.2 MB escaped), the cause (at most 32 KiB) and the
	// limits hit (their known names). The security settings read back
	// from the container hold every input's mount (at most 32, with paths
	// of at most 1,024 bytes): about 0.2 MB escaped at worst. 8 MiB
	// covers them with room.
	resultFixedPayload = 8<<20 + statementPayload

	// maxResultPayload is the largest payload whose envelope fits
	// MaxResultBytes.
	maxResultPayload = (MaxResultBytes - envelopeFraming) / 4 * 3
)

// envelopeFraming is an envelope's bytes besides its base64 payload and its
// signatures (which statementPayload allows for).
const envelopeFraming = int64(len(`{"payload":"","payloadType":"` + InTotoPayloadType + `","signatures":[]}`))

// envelopeBytes is the size of an envelope whose payload takes payload
// bytes: standard base64 (4 bytes per 3, padded) and the framing. The
// signatures are counted in the payload's statementPayload, at 4/3 of the
// bytes they take: an allowance, not a tight count.
func envelopeBytes(payload int64) int64 {
	return envelopeFraming + (payload+2)/3*4
}
