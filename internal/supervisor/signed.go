package supervisor

import (
	"context"
	"errors"
	"fmt"

	"github.com/sandboxd/sandboxd/sandbox"
)

// signedKey is the retention key of the signed form of the assessment
// retained under key, signed by the key with keyID.
func signedKey(key, keyID string) string {
	canon, err := sandbox.CanonicalJSON(struct {
		Assessment string `json:"assessment"`
		KeyID      string `json:"key_id"`
		Form       string `json:"form"`
	}{key, keyID, sandbox.SignedAssessmentSchema})
	if err != nil {
		panic(err) // strings only: cannot fail
	}
	return sandbox.DigestBytes(canon)
}

// RetainSigned returns the signed form of a retained assessment by the key
// with keyID: the bytes retained before, or else sign's, retained now. A
// signature is not deterministic, so the signed form is made once and kept:
// asked again, even after a restart, the same assessment gets the same
// bytes. If two requests sign at once, the first retained wins and both
// get its bytes. The supervisor never signs (it holds no key): sign does.
func (s *Supervisor) RetainSigned(ctx context.Context, a Assessment, keyID string, sign func() ([]byte, error)) ([]byte, error) {
	key := signedKey(a.Binding.Key(), keyID)
	if b, err := s.store.Load(ctx, key); err == nil {
		return b, nil
	} else if !errors.Is(err, sandbox.ErrNotFound) {
		return nil, err
	}
	data, err := sign()
	if err != nil {
		return nil, fmt.Errorf("sign assessment: %w", err)
	}
	retained, err := s.store.Retain(ctx, key, data)
	if errors.Is(err, sandbox.ErrConflict) && retained != nil {
		return retained, nil
	}
	return retained, err
}
