package seccomp

import (
	"crypto/sha256"
	"encoding/hex"
)

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}
