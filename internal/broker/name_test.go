package broker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/broker/enginefake"
)

// nameBrokers returns n brokers of one name on one in-memory engine (as
// daemons on separate state directories are), with quick beats.
func nameBrokers(t *testing.T, n int) ([]*Broker, *enginefake.Engine) {
	t.Helper()
	b, eng := newFakeBroker(t, 0)
	cfg := b.cfg
	cfg.NameBeat, cfg.NameStale = 20*time.Millisecond, 400*time.Millisecond
	var out []*Broker
	for range n {
		nb, err := New(eng, b.blobs, cfg)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, nb)
	}
	return out, eng
}

// markNames lists the marks of name on eng.
func markNames(t *testing.T, eng *enginefake.Engine, name string) []string {
	t.Helper()
	f := make(client.Filters).Add("label", LabelBroker+"="+name, LabelRole+"="+roleDaemon)
	vs, err := eng.VolumeList(context.Background(), client.VolumeListOptions{Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, v := range vs.Items {
		out = append(out, v.Name)
	}
	return out
}

// putMark makes mark seq of name as another process would, holder
// labelled with process p (selfProcess's form).
func putMark(t *testing.T, eng *enginefake.Engine, name string, seq uint64, holder, p string) {
	t.Helper()
	_, err := eng.VolumeCreate(context.Background(), client.VolumeCreateOptions{Name: fmt.Sprintf("%s-daemon-%d", name, seq),
		Labels: map[string]string{LabelBroker: name, LabelRole: roleDaemon, LabelNonce: "other-" + holder, LabelHolder: holder, labelProcess: p}})
	if err != nil {
		t.Fatal(err)
	}
}

// elsewhere is a process on another boot: one this host cannot check.
const elsewhere = "00000000-0000-0000-0000-000000000000 pid:[1] 1 1"

// A second daemon of a name a live one holds is refused at once, naming
// the holder; the holder renews its hold (one mark, moving up); once it
// releases the name, it leaves no mark and the next claim holds at once.
func TestNameHeldByALiveDaemonIsRefused(t *testing.T) {
	bs, eng := nameBrokers(t, 2)
	first, err := bs[0].ClaimName(context.Background(), "state A")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = bs[1].ClaimName(context.Background(), "state B")
	if !errors.Is(err, ErrNameHeld) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) || !strings.Contains(err.Error(), "state A") {
		t.Fatalf("second claim: got %v, want ErrNameHeld naming pid %d and state A", err, os.Getpid())
	}
	if d := time.Since(start); d > bs[1].cfg.NameStale/2 {
		t.Errorf("the refusal took %v: a holder this host can check is refused at once", d)
	}
	time.Sleep(5 * bs[0].cfg.NameBeat)
	// A renewal makes the next mark, then removes the one before: read
	// between the two, there are two (CI). Read again until one, within
	// a few beats.
	ms := markNames(t, eng, bs[0].cfg.Name)
	for deadline := time.Now().Add(5 * bs[0].cfg.NameBeat); len(ms) == 2 && time.Now().Before(deadline); {
		time.Sleep(bs[0].cfg.NameBeat / 4)
		ms = markNames(t, eng, bs[0].cfg.Name)
	}
	if len(ms) != 1 || ms[0] == bs[0].markName(1) {
		t.Errorf("marks after some beats: %v, want one, renewed past %s", ms, bs[0].markName(1))
	}
	first.Release()
	if ms := markNames(t, eng, bs[0].cfg.Name); len(ms) != 0 {
		t.Errorf("marks after release: %v, want none", ms)
	}
	second, err := bs[1].ClaimName(context.Background(), "state B")
	if err != nil {
		t.Fatalf("claim after the holder released the name: %v", err)
	}
	second.Release()
}

// The mark of a daemon that was killed (its process is gone, or its pid
// is another process's now) does not hold the name: a claim takes it at
// once and removes the dead daemon's marks.
func TestNameOfAKilledDaemonIsTakenAtOnce(t *testing.T) {
	bs, eng := nameBrokers(t, 1)
	me := strings.Fields(selfProcess())
	if len(me) != 4 {
		t.Fatalf("selfProcess: %q", selfProcess())
	}
	name := bs[0].cfg.Name
	// The same boot and pid namespace, this pid but another start: the
	// pid was reused since its holder died.
	putMark(t, eng, name, 6, "killed", strings.Join([]string{me[0], me[1], me[2], "1"}, " "))
	putMark(t, eng, name, 7, "killed", strings.Join([]string{me[0], me[1], me[2], "1"}, " "))
	start := time.Now()
	l, err := bs[0].ClaimName(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if d := time.Since(start); d > bs[0].cfg.NameStale/2 {
		t.Errorf("taking a dead holder's name took %v, want at once", d)
	}
	if ms := markNames(t, eng, name); len(ms) != 1 || ms[0] != bs[0].markName(8) {
		t.Errorf("marks: %v, want only %s", ms, bs[0].markName(8))
	}
}

// A holder this host cannot check (another host, container or boot) is
// watched: one that renews its hold is refused; one that does not is
// taken for dead after NameStale, not before.
func TestNameOfAnUncheckableHolderIsWatched(t *testing.T) {
	bs, eng := nameBrokers(t, 2)
	name, stale := bs[0].cfg.Name, bs[0].cfg.NameStale

	putMark(t, eng, name, 1, "far away", elsewhere)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // it renews, as a live holder does
		defer wg.Done()
		for seq := uint64(2); ; seq++ {
			select {
			case <-stop:
				return
			case <-time.After(bs[0].cfg.NameBeat):
			}
			putMark(t, eng, name, seq, "far away", elsewhere)
			eng.RemoveVolume(fmt.Sprintf("%s-daemon-%d", name, seq-1))
		}
	}()
	_, err := bs[0].ClaimName(context.Background(), "")
	close(stop)
	wg.Wait()
	if !errors.Is(err, ErrNameHeld) || !strings.Contains(err.Error(), "far away") {
		t.Fatalf("claim of a name a renewing holder holds: got %v, want ErrNameHeld naming it", err)
	}

	start := time.Now()
	l, err := bs[1].ClaimName(context.Background(), "")
	if err != nil {
		t.Fatalf("claim of a name a holder stopped renewing: %v", err)
	}
	defer l.Release()
	if d := time.Since(start); d < stale {
		t.Errorf("took the name after %v, want at least NameStale (%v)", d, stale)
	}
}

// Daemons of one name starting together: exactly one holds it.
func TestNameClaimedByOneOfManyAtOnce(t *testing.T) {
	for range 20 {
		bs, _ := nameBrokers(t, 4)
		var mu sync.Mutex
		var held []*NameLease
		var wg sync.WaitGroup
		for _, b := range bs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l, err := b.ClaimName(context.Background(), "")
				if err != nil && !errors.Is(err, ErrNameHeld) {
					t.Error(err)
				}
				if err == nil {
					mu.Lock()
					held = append(held, l)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if len(held) != 1 {
			t.Fatalf("%d daemons hold the name, want 1", len(held))
		}
		held[0].Release()
	}
}

// A holder whose mark another process went past (it could not renew while
// that one watched) learns that it lost the name, and its release leaves
// the other's mark.
func TestNameLostToAnotherIsReported(t *testing.T) {
	bs, eng := nameBrokers(t, 1)
	b := bs[0]
	b.cfg.NameBeat = 300 * time.Millisecond
	l, err := b.ClaimName(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	putMark(t, eng, b.cfg.Name, 2, "the taker", elsewhere) // before the first renewal
	select {
	case <-l.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the lease was not lost")
	}
	if err := l.Err(); err == nil || !strings.Contains(err.Error(), "the taker") {
		t.Errorf("Err: got %v, want it to name the taker", err)
	}
	l.Release()
	if ms := markNames(t, eng, b.cfg.Name); len(ms) != 1 || ms[0] != b.markName(2) {
		t.Errorf("marks after the loser's release: %v, want only the taker's %s", ms, b.markName(2))
	}
}
