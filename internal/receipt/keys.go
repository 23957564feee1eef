package receipt

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"

	"github.com/secure-systems-lab/go-securesystemslib/encrypted"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
)

// Key file errors callers may branch on.
var (
	// ErrWrongPassword marks a private key that does not decrypt with the
	// password given (or whose ciphertext was altered: the two cannot be
	// told apart).
	ErrWrongPassword = errors.New("wrong password")
	// ErrKeyFormat marks a key file that is not what sandboxd reads.
	ErrKeyFormat = errors.New("unsupported key file")
)

// PEM block types. sandboxd writes the first; cosign's older type is read.
const (
	pemEncryptedSigstore = string(cryptoutils.EncryptedSigstorePrivateKeyPEMType) // "ENCRYPTED SIGSTORE PRIVATE KEY"
	pemEncryptedCosign   = "ENCRYPTED COSIGN PRIVATE KEY"
)

// GenerateKeyPair creates an ECDSA P-256 key pair in cosign's formats: the
// private key as PKCS #8 DER encrypted with scrypt + NaCl secretbox
// (go-securesystemslib's encrypted package, as `cosign generate-key-pair`
// does) in an "ENCRYPTED SIGSTORE PRIVATE KEY" PEM block, and the public key
// as a PKIX "PUBLIC KEY" PEM block. An empty password is allowed; the key
// is still encrypted, as cosign does.
func GenerateKeyPair(password []byte) (privPEM, pubPEM []byte, err error) {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate key: %w", err)
	}
	return encodeKeyPair(priv, password)
}

func encodeKeyPair(priv *ecdsa.PrivateKey, password []byte) (privPEM, pubPEM []byte, err error) {
	if password == nil {
		password = []byte{} // nil would mean "do not encrypt" to cryptoutils
	}
	der, err := cryptoutils.MarshalPrivateKeyToEncryptedDER(priv, cryptoutils.StaticPasswordFunc(password))
	if err != nil {
		return nil, nil, fmt.Errorf("encrypt private key: %w", err)
	}
	pubPEM, err = cryptoutils.MarshalPublicKeyToPEM(priv.Public())
	if err != nil {
		return nil, nil, fmt.Errorf("encode public key: %w", err)
	}
	return cryptoutils.PEMEncode(cryptoutils.EncryptedSigstorePrivateKeyPEMType, der), pubPEM, nil
}

// LoadSigner reads an encrypted private key file (as GenerateKeyPair or
// cosign write it) and decrypts it once: scrypt is deliberately slow, so
// call it at start-up, not per job.
func LoadSigner(path string, password []byte) (*Signer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	s, err := ParseSigner(data, password)
	if err != nil {
		return nil, fmt.Errorf("signing key %s: %w", path, err)
	}
	return s, nil
}

// ParseSigner is LoadSigner for key bytes already in memory.
func ParseSigner(privPEM, password []byte) (*Signer, error) {
	priv, err := decodePrivateKey(privPEM, password)
	if err != nil {
		return nil, err
	}
	return newSigner(priv, false)
}

// NewEphemeralSigner generates a key that lives only in memory. Every
// envelope it signs says so (Broker.EphemeralKey), because nobody can pin a
// key that disappears with the process.
func NewEphemeralSigner() (*Signer, error) {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate ephemeral key: %w", err)
	}
	return newSigner(priv, true)
}

// wellSealed reports whether an encrypted key's envelope names what
// encrypted.Decrypt can open (scrypt with one of its parameter sets,
// nacl/secretbox with a 24-byte nonce). Decrypt's errors are text, not
// classes: when the envelope is well formed, its failure can only be the
// password (or a changed ciphertext), so no code reads its message.
func wellSealed(b []byte) bool {
	var env struct {
		KDF struct {
			Name   string `json:"name"`
			Params struct {
				N int `json:"N"`
				R int `json:"r"`
				P int `json:"p"`
			} `json:"params"`
		} `json:"kdf"`
		Cipher struct {
			Name  string `json:"name"`
			Nonce []byte `json:"nonce"`
		} `json:"cipher"`
	}
	if json.Unmarshal(b, &env) != nil {
		return false
	}
	p := env.KDF.Params
	knownParams := (p.N == 1<<15 || p.N == 1<<16 || p.N == 1<<17) && p.R == 8 && p.P == 1
	return env.KDF.Name == "scrypt" && knownParams && env.Cipher.Name == "nacl/secretbox" && len(env.Cipher.Nonce) == 24
}

func decodePrivateKey(privPEM, password []byte) (*ecdsa.PrivateKey, error) {
	block, _ := pem.Decode(privPEM)
	if block == nil {
		return nil, fmt.Errorf("%w: not PEM (want an %q block)", ErrKeyFormat, pemEncryptedSigstore)
	}
	if block.Type != pemEncryptedSigstore && block.Type != pemEncryptedCosign {
		return nil, fmt.Errorf("%w: PEM block %q (want %q; sandboxd never reads unencrypted private keys)", ErrKeyFormat, block.Type, pemEncryptedSigstore)
	}
	if password == nil {
		password = []byte{}
	}
	der, err := encrypted.Decrypt(block.Bytes, password)
	if err != nil {
		if wellSealed(block.Bytes) {
			return nil, fmt.Errorf("%w (or the key file is corrupted)", ErrWrongPassword)
		}
		return nil, fmt.Errorf("%w: %w", ErrKeyFormat, err)
	}
	key, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("%w: decrypted key is not PKCS #8: %w", ErrKeyFormat, err)
	}
	priv, ok := key.(*ecdsa.PrivateKey)
	if !ok || priv.Curve != elliptic.P256() {
		return nil, fmt.Errorf("%w: unsupported key type %s (want ECDSA P-256)", ErrKeyFormat, keyTypeName(key))
	}
	return priv, nil
}

func keyTypeName(k crypto.PrivateKey) string {
	if ec, ok := k.(*ecdsa.PrivateKey); ok {
		return "ECDSA " + ec.Curve.Params().Name
	}
	return fmt.Sprintf("%T", k)
}
