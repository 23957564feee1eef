package receipt

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// WriteKeyPair writes a pair LoadSigner reads, the private key 0600, and
// never overwrites either file.
func TestWriteKeyPair(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "broker")
	keyPath, pubPath, keyID, err := WriteKeyPair(prefix, []byte("pw"))
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600", keyPath, st.Mode().Perm())
	}
	s, err := LoadSigner(keyPath, []byte("pw"))
	if err != nil {
		t.Fatal(err)
	}
	if s.KeyID() != keyID {
		t.Errorf("key id %s, the signer's is %s", keyID, s.KeyID())
	}
	pub, err := os.ReadFile(pubPath)
	if err != nil || string(pub) != string(s.PublicKeyPEM()) {
		t.Errorf("%s is not the signer's public key (%v)", pubPath, err)
	}

	for name, existing := range map[string]string{"key": ".key", "pub": ".pub"} {
		t.Run("refuses an existing "+name, func(t *testing.T) {
			prefix := filepath.Join(t.TempDir(), "broker")
			if err := os.WriteFile(prefix+existing, []byte("mine"), 0o644); err != nil {
				t.Fatal(err)
			}
			_, _, _, err := WriteKeyPair(prefix, nil)
			if !errors.Is(err, fs.ErrExist) {
				t.Fatalf("got %v, want an error matching fs.ErrExist", err)
			}
			if b, _ := os.ReadFile(prefix + existing); string(b) != "mine" {
				t.Errorf("%s was overwritten", prefix+existing)
			}
			ents, _ := os.ReadDir(filepath.Dir(prefix))
			if len(ents) != 1 {
				t.Errorf("%d files left, want only the existing one", len(ents))
			}
		})
	}
}
