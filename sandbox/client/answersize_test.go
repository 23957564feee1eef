package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/sandbox/client"
)

// viewOfSize serves every request with a job view of size bytes: valid
// JSON, padded with white space, streamed without a length unless
// declared is set.
func viewOfSize(t *testing.T, size int64, declared bool) *client.Client {
	t.Helper()
	view := []byte(`{"id":"job-1","digest":"sha256:` + strings.Repeat("a", 64) + `","state":"started","accepted_at":"2025-01-01T00:00:00Z","receipt":{}`)
	pad := bytes.Repeat([]byte(" "), 1<<20)
	socket := filepath.Join(t.TempDir(), "sandboxd.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if declared {
			w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		}
		if _, err := w.Write(view); err != nil {
			return
		}
		for left := size - int64(len(view)) - 1; left > 0; left -= int64(len(pad)) {
			if _, err := w.Write(pad[:min(left, int64(len(pad)))]); err != nil {
				return // the client stopped reading
			}
		}
		w.Write([]byte("}"))
	}))
	hs.Listener.Close()
	hs.Listener = ln
	hs.Start()
	t.Cleanup(hs.Close)
	c := client.New(socket, sandbox.KeySet{})
	t.Cleanup(c.Close)
	return c
}

// A job's view is read whole up to what a signed result and its receipt
// can take, and past that refused with an error that says so, names the
// job and the bound, and matches sandbox.ErrTooLarge: never cut short
// into a JSON syntax error, nor retried as if the daemon had not answered.
func TestAnswerSizeIsBounded(t *testing.T) {
	over := int64(sandbox.MaxResultBytes + 32<<20)
	for _, tc := range []struct {
		name     string
		size     int64
		declared bool
		wantErr  bool
	}{
		{"small", 1 << 10, false, false},
		{"a result at its bound and its receipt (past the old 64 MiB cut)", sandbox.MaxResultBytes + 4<<20, false, false},
		{"over, streamed", over, false, true},
		{"over, declared", over, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := viewOfSize(t, tc.size, tc.declared)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			v, err := c.Status(ctx, "job-1")
			if !tc.wantErr {
				if err != nil || v.ID != "job-1" {
					t.Fatalf("a view of %d bytes: got %+v, %v; want it read whole", tc.size, v.ID, err)
				}
				return
			}
			if !errors.Is(err, sandbox.ErrTooLarge) || !strings.Contains(err.Error(), "job-1") || !strings.Contains(err.Error(), fmt.Sprint(sandbox.MaxResultBytes)) {
				t.Fatalf("a view of %d bytes: got %v, want an error matching sandbox.ErrTooLarge naming the job and %d", tc.size, err, sandbox.MaxResultBytes)
			}
			// Waiting gives up at once: asking again gets the same answer.
			job := sandbox.Job{ID: "job-1", Digest: "sha256:" + strings.Repeat("a", 64)}
			start := time.Now()
			_, err = c.Wait(ctx, job)
			if !errors.Is(err, sandbox.ErrTooLarge) || errors.Is(err, sandbox.ErrUncertain) || !strings.Contains(err.Error(), "wait for job job-1") {
				t.Fatalf("wait: got %v, want an error matching sandbox.ErrTooLarge (not uncertain) naming job-1", err)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("wait took %v to give up", d)
			}
		})
	}
}
