package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// lockedBuffer is a log the reader goroutine writes while the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// serve's SIGHUP reads --tenants again: a file that decodes is taken, one
// that does not is not, and the daemon says which (the reload itself is
// internal/server's TestTenantsReload).
func TestSIGHUPReadsTheTenantsAgain(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tenants.json")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"schema": "sandboxd.tenants/v1", "tenants": [{"name": "a", "identities": [{"role": "admin", "uids": [0]}]}]}`)
	o := serveOptions{tenants: file}
	tenants, err := o.loadTenants()
	if err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	stop := o.reloadTenantsOnHUP(tenants, slog.New(slog.NewTextHandler(&logs, nil)))
	defer stop()
	hup := func(want string) {
		t.Helper()
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), want); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("after SIGHUP the log says %q, want %q", logs.String(), want)
			}
		}
	}
	write(`{"schema": "sandboxd.tenants/v1", "tenants": [{"name": "b", "identities": [{"role": "admin", "uids": [0]}]}]}`)
	hup("SIGHUP: tenants reloaded")
	write(`{"schema": "sandboxd.tenants/v1", "tenants": [{"name": "b", "unknown": 1}]}`)
	hup("SIGHUP: tenants not reloaded; the tenants read before stay")
	if !strings.Contains(logs.String(), "unknown") {
		t.Errorf("the refusal does not say what was wrong: %s", logs.String())
	}
}
