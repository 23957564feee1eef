package server

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

func TestLockStateNamesTheHolder(t *testing.T) {
	dir := t.TempDir()
	unlock, err := LockState(dir)
	if err != nil {
		t.Fatal(err)
	}
	// A second lock (another open file, as another process would have)
	// is refused, naming this process.
	_, err = LockState(dir)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) || !strings.Contains(err.Error(), "another --state") {
		t.Fatalf("second lock: got %v, want an error naming pid %d", err, os.Getpid())
	}
	unlock()
	unlock2, err := LockState(dir)
	if err != nil {
		t.Fatalf("lock after unlock: %v", err)
	}
	unlock2()
}
