package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// shimPath finds the in-container helper: $SANDBOXD_SHIM, or
// sandboxd-shim next to this executable.
func shimPath() (string, error) {
	if p := os.Getenv("SANDBOXD_SHIM"); p != "" {
		return p, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	p := filepath.Join(filepath.Dir(exe), "sandboxd-shim")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("the helper binary sandboxd-shim is not next to %s (build it with CGO_ENABLED=0 go build -o %s ./cmd/sandboxd-shim, or set SANDBOXD_SHIM)", exe, filepath.Dir(exe))
	}
	return p, nil
}

// stateDir is where a one-shot command keeps its blob store:
// $SANDBOXD_STATE, else the user cache directory.
func stateDir() (string, error) {
	if p := os.Getenv("SANDBOXD_STATE"); p != "" {
		return p, nil
	}
	c, err := os.UserCacheDir()
	if err != nil {
		return "", errors.New("no state directory: set SANDBOXD_STATE")
	}
	return filepath.Join(c, "sandboxd"), nil
}

// digestMemo is where a state directory remembers the digests of the
// helper and probe binaries across processes (internal/filedigest).
func digestMemo(state string) string { return filepath.Join(state, "digests") }

// brokerNameOr is $SANDBOXD_BROKER_NAME, else def: separate brokers on one
// engine (tests, several users) keep separate containers and cache volumes.
func brokerNameOr(def string) string {
	if name := os.Getenv("SANDBOXD_BROKER_NAME"); name != "" {
		return name
	}
	return def
}
