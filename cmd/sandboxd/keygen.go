package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/sandboxd/sandboxd/internal/receipt"
	"github.com/sandboxd/sandboxd/sandbox"
)

// keyPasswordEnv holds the password of a broker's private key. Unset and
// empty both mean the empty password (the key file is still encrypted, as
// cosign does).
const keyPasswordEnv = "SANDBOXD_KEY_PASSWORD"

type keygenOptions struct {
	prefix string // writes prefix.key and prefix.pub
}

// cmdKeygen writes a cosign-compatible signing key pair: PREFIX.key (mode
// 0600, "ENCRYPTED SIGSTORE PRIVATE KEY") and PREFIX.pub. It never
// overwrites a file.
func cmdKeygen(_ context.Context, args []string, stdout, stderr io.Writer) int {
	var o keygenOptions
	fset := flag.NewFlagSet("keygen", flag.ContinueOnError)
	fset.SetOutput(stderr)
	fset.StringVar(&o.prefix, "o", "", "write the key pair to `PREFIX`.key and PREFIX.pub")
	fset.Usage = func() {
		fmt.Fprintf(stderr, "usage: sandboxd keygen -o PREFIX\n\nThe private key is encrypted with $%s (empty if unset).\n\n", keyPasswordEnv)
		fset.PrintDefaults()
	}
	if err := fset.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if o.prefix == "" || fset.NArg() != 0 {
		fset.Usage()
		return exitUsage
	}
	keyPath, pubPath := o.prefix+".key", o.prefix+".pub"
	for _, p := range []string{keyPath, pubPath} {
		if _, err := os.Lstat(p); err == nil {
			fmt.Fprintf(stderr, "sandboxd: keygen: %s exists; refusing to overwrite it\n", p)
			return exitBadInput
		} else if !errors.Is(err, fs.ErrNotExist) {
			fmt.Fprintf(stderr, "sandboxd: keygen: %v\n", err)
			return exitInfraError
		}
	}
	priv, pub, err := receipt.GenerateKeyPair([]byte(os.Getenv(keyPasswordEnv)))
	if err != nil {
		fmt.Fprintf(stderr, "sandboxd: keygen: %v\n", err)
		return exitInfraError
	}
	keys, err := sandbox.ParseKeySet(pub)
	if err != nil {
		fmt.Fprintf(stderr, "sandboxd: keygen: %v\n", err)
		return exitInfraError
	}
	if err := writeKeyFile(keyPath, priv, 0o600); err != nil {
		fmt.Fprintf(stderr, "sandboxd: keygen: %v\n", err)
		return keygenWriteExit(err)
	}
	if err := writeKeyFile(pubPath, pub, 0o644); err != nil {
		os.Remove(keyPath) // a private key without its public half is useless
		fmt.Fprintf(stderr, "sandboxd: keygen: %v\n", err)
		return keygenWriteExit(err)
	}
	fmt.Fprintf(stdout, "private key: %s\npublic key:  %s\nkey id:      %s\n", keyPath, pubPath, keys.KeyIDs()[0])
	return exitOK
}

func keygenWriteExit(err error) int {
	if errors.Is(err, fs.ErrExist) {
		return exitBadInput
	}
	return exitInfraError
}

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
