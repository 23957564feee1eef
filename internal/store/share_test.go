package store

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// shared opens the store at dir as one more process sharing it would.
func shared(t *testing.T, dir string) (*Store, func()) {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	leave, err := s.Share()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(leave)
	return s, leave
}

// registrations lists the registration files in dir.
func registrations(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, "users"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, filepath.Join(dir, "users", e.Name()))
	}
	return out
}

func backdate(t *testing.T, p string, ago time.Duration) {
	t.Helper()
	old := time.Now().Add(-ago)
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
}

func none(string) bool { return false }

// Two one-shot processes share a state directory: the second one's sweep
// at its end spares what the first, still running, used since it began
// (its pins are in its own memory), and removes what it used before it
// began, and everything once it is gone. A dead process's registration
// keeps nothing.
func TestSharedSweepSparesWhatAnotherLiveProcessUses(t *testing.T) {
	dir := t.TempDir()
	running, leaveRunning := shared(t, dir)
	regs := registrations(t, dir)
	if len(regs) != 1 {
		t.Fatalf("got registrations %v, want one", regs)
	}
	backdate(t, regs[0], 2*time.Hour) // it began two hours ago
	used := put(t, running, "an input the running process used an hour ago")
	p, _ := running.Path(used)
	backdate(t, p, time.Hour)
	before := oldOrphan(t, running, "a blob last used before it began")
	p, _ = running.Path(before)
	backdate(t, p, 3*time.Hour)
	// A process that died two days ago left its registration.
	dead := filepath.Join(dir, "users", "1-dead")
	if err := os.WriteFile(dead, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	backdate(t, dead, 48*time.Hour)

	sweeper, _ := shared(t, dir)
	policy := SweepPolicy{Referenced: none, MinAge: 10 * time.Minute, Budget: 1}
	if _, err := sweeper.Sweep(policy); err != nil {
		t.Fatal(err)
	}
	if !sweeper.Has(used) {
		t.Error("a blob a live process used since it began was removed")
	}
	if sweeper.Has(before) {
		t.Error("a blob last used before the oldest live process began is still there")
	}
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("the dead process's registration is still there: %v", err)
	}
	leaveRunning()
	if _, err := sweeper.Sweep(policy); err != nil {
		t.Fatal(err)
	}
	if sweeper.Has(used) {
		t.Error("the blob outlived the process that used it")
	}
}

// The sweep lock reaches other processes: while one claims a blob, no
// other can remove one, and while one removes a blob, no other can claim
// one (each process's own lock is in its memory).
func TestSharedSweepLockExcludesOtherProcesses(t *testing.T) {
	dir := t.TempDir()
	claimer, _ := shared(t, dir)
	sweeper, _ := shared(t, dir)
	probe := func(how int) error {
		f, err := os.Open(filepath.Join(dir, "sweep.lock"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		return unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
	}
	claimer.refs.sweep.RLock()
	if err := probe(unix.LOCK_EX); err != unix.EWOULDBLOCK {
		t.Errorf("during a claim another process's removal got %v, want to wait (EWOULDBLOCK)", err)
	}
	claimer.refs.sweep.RUnlock()
	if err := probe(unix.LOCK_EX); err != nil {
		t.Errorf("after the claim: %v, want the lock free", err)
	}
	d := oldOrphan(t, sweeper, "an orphan")
	checked := false
	raceHook(t, func(stage, hd string) {
		if stage == "checked" && hd == d {
			checked = true
			if err := probe(unix.LOCK_SH); err != unix.EWOULDBLOCK {
				t.Errorf("during a removal another process's claim got %v, want to wait (EWOULDBLOCK)", err)
			}
		}
	})
	if _, err := sweeper.Sweep(SweepPolicy{Referenced: none}); err != nil {
		t.Fatal(err)
	}
	if !checked || sweeper.Has(d) {
		t.Fatalf("the orphan was not removed (checked %v)", checked)
	}
}

// What is not a registration in users/ (a FIFO, a symlink) neither hangs
// a sweep nor is taken for a dead process's: it counts as held.
func TestHeldNeverBlocksOnWhatIsNotARegistration(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(filepath.Join(dir, "elsewhere"), link); err != nil {
		t.Fatal(err)
	}
	done := make(chan [2]bool, 1)
	go func() { done <- [2]bool{held(fifo), held(link)} }()
	select {
	case got := <-done:
		if !got[0] || !got[1] {
			t.Errorf("held: fifo %v, symlink %v; want both held (not registrations, never removed as dead)", got[0], got[1])
		}
	case <-time.After(5 * time.Second):
		t.Fatal("held blocked on a FIFO")
	}
}
