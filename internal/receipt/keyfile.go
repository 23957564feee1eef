package receipt

import (
	"errors"
	"io/fs"
	"os"

	"github.com/sandboxd/sandboxd/sandbox"
)

// WriteKeyPair generates a key pair (GenerateKeyPair) and writes it to
// PREFIX.key (mode 0600) and PREFIX.pub. It never overwrites a file: an
// existing one is an error matching fs.ErrExist, and then, as on any
// error, nothing is left written. keyID is the public key's id.
func WriteKeyPair(prefix string, password []byte) (keyPath, pubPath, keyID string, err error) {
	keyPath, pubPath = prefix+".key", prefix+".pub"
	for _, p := range []string{keyPath, pubPath} {
		if _, err := os.Lstat(p); err == nil {
			return "", "", "", keyFileExists(p)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return "", "", "", err
		}
	}
	priv, pub, err := GenerateKeyPair(password)
	if err != nil {
		return "", "", "", err
	}
	keys, err := sandbox.ParseKeySet(pub)
	if err != nil {
		return "", "", "", err
	}
	if err := writeKeyFile(keyPath, priv, 0o600); err != nil {
		return "", "", "", err
	}
	if err := writeKeyFile(pubPath, pub, 0o644); err != nil {
		os.Remove(keyPath) // a private key without its public half is useless
		return "", "", "", err
	}
	return keyPath, pubPath, keys.KeyIDs()[0], nil
}

// keyFileExists is a key file WriteKeyPair will not overwrite.
type keyFileExists string

func (p keyFileExists) Error() string { return string(p) + " exists; refusing to overwrite it" }

func (keyFileExists) Is(target error) bool { return target == fs.ErrExist }

// writeKeyFile creates path (failing if it exists, even if it appeared
// since the check above), writes data and syncs it.
func writeKeyFile(path string, data []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	return f.Close()
}
