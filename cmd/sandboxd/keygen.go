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
	keyPath, pubPath, keyID, err := receipt.WriteKeyPair(o.prefix, []byte(os.Getenv(keyPasswordEnv)))
	if err != nil {
		fmt.Fprintf(stderr, "sandboxd: keygen: %v\n", err)
		return keygenWriteExit(err)
	}
	fmt.Fprintf(stdout, "private key: %s\npublic key:  %s\nkey id:      %s\n", keyPath, pubPath, keyID)
	return exitOK
}

func keygenWriteExit(err error) int {
	if errors.Is(err, fs.ErrExist) {
		return exitBadInput
	}
	return exitInfraError
}
