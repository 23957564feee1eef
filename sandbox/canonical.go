package sandbox

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
)

// CanonicalJSON encodes v as canonical JSON: UTF-8, object keys sorted, no
// insignificant white space and no HTML escaping. Numbers keep the exact
// text encoding/json produced for them.
func CanonicalJSON(v any) ([]byte, error) {
	raw, err := marshalNoEscape(v)
	if err != nil {
		return nil, err
	}
	// Round-trip through a generic value so that keys of nested objects are
	// sorted whatever their Go type; UseNumber keeps integers exact.
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var generic any
	if err := dec.Decode(&generic); err != nil {
		return nil, fmt.Errorf("canonical json: %w", err)
	}
	return marshalNoEscape(generic)
}

// SealedDigest returns the digest of a sealed object: the SHA-256 of its
// canonical JSON with the top-level "digest" field removed.
func SealedDigest(v any) (string, error) {
	raw, err := marshalNoEscape(v)
	if err != nil {
		return "", err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		return "", fmt.Errorf("sealed digest: %w", err)
	}
	delete(obj, "digest")
	canon, err := marshalNoEscape(obj)
	if err != nil {
		return "", err
	}
	return DigestBytes(canon), nil
}

func marshalNoEscape(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// DigestBytes returns the sha256 digest of b in sandboxd's form.
func DigestBytes(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

var digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// ValidDigest reports whether s is "sha256:" followed by 64 lowercase hex digits.
func ValidDigest(s string) bool { return digestRE.MatchString(s) }

// decodeStrict decodes exactly one JSON value into v, refusing unknown fields
// and trailing data.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("trailing data after the JSON value")
	}
	var extra json.RawMessage
	if err := dec.Decode(&extra); err == nil {
		return fmt.Errorf("trailing data after the JSON value")
	}
	return nil
}
