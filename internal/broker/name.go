package broker

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/moby/moby/client"
	"golang.org/x/sys/unix"
)

// A daemon's broker name is its identity on the engine: its recovery and
// its reaper settle every container of that name no journal of its own
// names. Two live daemons of one name (on two state directories) would
// reap each other's pooled sandboxes and leftovers, so a daemon holds its
// name while it lives (ClaimName) and a second one of that name refuses to
// start, naming the first.
//
// The hold is a chain of marks on the engine: volumes (every engine has
// them, and they need no image) named NAME-daemon-SEQ, labelled with the
// holder. Creating a volume is create-if-absent on both engines (the
// existing one comes back with its own labels), so whoever creates SEQ
// first holds it, and no two processes ever both hold one SEQ. The holder
// renews its hold every NameBeat by creating SEQ+1 and removing SEQ. A
// starting daemon looks at the highest mark:
//   - none: it creates SEQ 1;
//   - its holder is a process it can check (same boot and pid namespace:
//     the pid and that pid's start time, which a reused pid does not
//     share): alive, it refuses at once; dead (SIGKILLed), it creates
//     SEQ+1 at once;
//   - its holder is a process it cannot check (another host, container or
//     boot): it watches the mark for NameStale; a renewal means alive, and
//     it refuses; none means dead, and it creates SEQ+1.
//
// Losing the create of SEQ+1 means another process holds the name now:
// a starting daemon refuses, naming it; a holder learns that it has lost
// its name (Lost), which happens only if it could not renew for NameStale
// while another daemon watched.
const roleDaemon = "daemon"

// Labels of a daemon's mark on its name.
const (
	// LabelHolder says, for people, which process holds the name.
	LabelHolder = "sandboxd.holder"
	// labelProcess identifies the holding process for a check on its host:
	// boot id, pid namespace, pid, start time.
	labelProcess = "sandboxd.process"
)

// ErrNameHeld marks a refusal to start: another live daemon holds the
// broker name on this engine.
var ErrNameHeld = errors.New("held by another live daemon on this engine")

// NameLease is this process's hold on its broker name on the engine.
type NameLease struct {
	b      *Broker
	labels map[string]string

	mu  sync.Mutex
	seq uint64 // the mark held now

	stop     context.CancelFunc // ends renew
	done     chan struct{}      // closed when renew returns
	lost     chan struct{}
	lostErr  error
	stopOnce sync.Once
}

// mark is a daemon's mark on its name, as listed.
type mark struct {
	name   string
	seq    uint64
	labels map[string]string
}

func (b *Broker) markName(seq uint64) string {
	return b.cfg.Name + "-daemon-" + strconv.FormatUint(seq, 10)
}

// ClaimName holds this broker's name on the engine for this process until
// Release, or refuses (ErrNameHeld) naming the live daemon that holds it.
// holder says, for people, what this daemon is (its state); the pid and
// host are added. It may take up to NameStale when the last holder is a
// process this host cannot check.
func (b *Broker) ClaimName(ctx context.Context, holder string) (*NameLease, error) {
	host, _ := os.Hostname()
	desc := fmt.Sprintf("pid %d on host %s", os.Getpid(), host)
	if holder != "" {
		desc += ", " + holder
	}
	l := &NameLease{b: b, done: make(chan struct{}), lost: make(chan struct{}),
		labels: map[string]string{LabelBroker: b.cfg.Name, LabelRole: roleDaemon, LabelNonce: nameNonce(), LabelHolder: desc, labelProcess: selfProcess()}}
	var watched *mark // an unchecked holder's mark, since watchedAt
	var watchedAt time.Time
	for {
		top, err := b.topMark(ctx)
		if err != nil {
			return nil, err
		}
		next := uint64(1)
		if top != nil {
			next = top.seq + 1
			switch processState(top.labels[labelProcess]) {
			case processAlive:
				return nil, errNameHeld(b.cfg.Name, top)
			case processUnknown:
				if watched != nil && watched.seq != top.seq {
					return nil, errNameHeld(b.cfg.Name, top) // it renewed its hold
				}
				if watched == nil {
					watched, watchedAt = top, time.Now()
					b.log.Info("the broker name's last holder cannot be checked from here; watching its mark", "holder", top.labels[LabelHolder], "stale_after", b.cfg.NameStale.String())
				}
				if time.Since(watchedAt) < b.cfg.NameStale {
					select {
					case <-ctx.Done():
						return nil, ctx.Err()
					case <-time.After(min(b.cfg.NameBeat/2, b.cfg.NameStale-time.Since(watchedAt))):
					}
					continue
				}
			}
		}
		won, got, err := b.createMark(ctx, next, l.labels)
		if err != nil {
			return nil, err
		}
		if !won {
			return nil, errNameHeld(b.cfg.Name, got)
		}
		if top != nil {
			b.log.Warn("took over the broker name from a daemon that is gone", "holder", top.labels[LabelHolder])
		}
		l.seq = next
		l.removeMarks(ctx, func(m mark) bool { return m.seq < next })
		rctx, stop := context.WithCancel(context.WithoutCancel(ctx))
		l.stop = stop
		go l.renew(rctx)
		return l, nil
	}
}

func nameNonce() string {
	var n [16]byte
	rand.Read(n[:])
	return hex.EncodeToString(n[:])
}

func errNameHeld(name string, m *mark) error {
	return fmt.Errorf("broker name %q is %w: %s (its mark: volume %s); stop that daemon, or give this one another --name",
		name, ErrNameHeld, m.labels[LabelHolder], m.name)
}

// topMark returns the highest mark of this broker's name, or nil.
func (b *Broker) topMark(ctx context.Context) (*mark, error) {
	ms, err := b.marks(ctx)
	if err != nil || len(ms) == 0 {
		return nil, err
	}
	return &ms[len(ms)-1], nil
}

// marks lists the marks of this broker's name, lowest first.
func (b *Broker) marks(ctx context.Context) ([]mark, error) {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.EngineTimeout)
	defer cancel()
	f := make(client.Filters).Add("label", LabelBroker+"="+b.cfg.Name).Add("label", LabelRole+"="+roleDaemon)
	vs, err := b.eng.VolumeList(ctx, client.VolumeListOptions{Filters: f})
	if err != nil {
		return nil, fmt.Errorf("broker name %q: list its marks: %w", b.cfg.Name, err)
	}
	var out []mark
	for _, v := range vs.Items {
		s, ok := strings.CutPrefix(v.Name, b.cfg.Name+"-daemon-")
		seq, err := strconv.ParseUint(s, 10, 64)
		if !ok || err != nil || seq == 0 {
			continue
		}
		out = append(out, mark{name: v.Name, seq: seq, labels: v.Labels})
	}
	slices.SortFunc(out, func(a, b mark) int { return cmp.Compare(a.seq, b.seq) })
	return out, nil
}

// createMark creates mark seq unless it exists: won reports whether it is
// this lease's (labels' nonce), got is the mark as the engine holds it.
func (b *Broker) createMark(ctx context.Context, seq uint64, labels map[string]string) (won bool, got *mark, err error) {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.EngineTimeout)
	defer cancel()
	name := b.markName(seq)
	v, err := b.eng.VolumeCreate(ctx, client.VolumeCreateOptions{Name: name, Labels: labels})
	if err != nil {
		return false, nil, fmt.Errorf("broker name %q: create its mark %s: %w", b.cfg.Name, name, err)
	}
	m := &mark{name: name, seq: seq, labels: v.Volume.Labels}
	return m.labels[LabelNonce] == labels[LabelNonce], m, nil
}

// removeMarks removes the marks of the name that drop says to.
func (l *NameLease) removeMarks(ctx context.Context, drop func(mark) bool) {
	ms, err := l.b.marks(ctx)
	if err != nil {
		l.b.log.Warn("list the broker name's marks", "error", err)
		return
	}
	for _, m := range ms {
		if drop(m) {
			l.removeMark(ctx, m.name)
		}
	}
}

func (l *NameLease) removeMark(ctx context.Context, name string) {
	ctx, cancel := context.WithTimeout(ctx, l.b.cfg.EngineTimeout)
	defer cancel()
	if _, err := l.b.eng.VolumeRemove(ctx, name, client.VolumeRemoveOptions{Force: true}); err != nil && !isNotFound(err) {
		l.b.log.Warn("remove a mark of the broker name", "volume", name, "error", err)
	}
}

// renew renews the hold every NameBeat until Release, or until another
// process took the name.
func (l *NameLease) renew(ctx context.Context) {
	defer close(l.done)
	t := time.NewTicker(l.b.cfg.NameBeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		l.mu.Lock()
		seq := l.seq
		l.mu.Unlock()
		won, got, err := l.b.createMark(ctx, seq+1, l.labels)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			l.b.log.Warn("renew the hold on the broker name", "error", err)
			continue // the mark held stays; the next beat tries again
		}
		if !won {
			l.lostErr = fmt.Errorf("broker name %q: another daemon took it while this one could not renew its hold for %v: %s (its mark: volume %s)",
				l.b.cfg.Name, l.b.cfg.NameStale, got.labels[LabelHolder], got.name)
			close(l.lost)
			return
		}
		l.mu.Lock()
		l.seq = seq + 1
		l.mu.Unlock()
		l.removeMark(ctx, l.b.markName(seq))
	}
}

// Lost is closed when another process took the name (Err says which):
// this one no longer holds it.
func (l *NameLease) Lost() <-chan struct{} { return l.lost }

// Err says why the name was lost, once Lost is closed.
func (l *NameLease) Err() error {
	select {
	case <-l.lost:
		return l.lostErr
	default:
		return nil
	}
}

// Release stops renewing and removes this lease's marks (one a renewal
// cut short may have made too), so that the next daemon of the name starts
// at once. A lost name's marks above this lease's are another's and stay.
func (l *NameLease) Release() {
	l.stopOnce.Do(func() {
		l.stop()
		<-l.done
		l.mu.Lock()
		seq := l.seq
		l.mu.Unlock()
		l.removeMarks(context.Background(), func(m mark) bool {
			return m.seq <= seq || m.labels[LabelNonce] == l.labels[LabelNonce]
		})
	})
}

// A process's state, as seen from this one.
type procState int

const (
	processUnknown procState = iota // another host, pid namespace or boot
	processAlive
	processDead
)

// selfProcess identifies this process for a check from its host: the
// boot, the pid namespace, the pid and the pid's start time (in clock
// ticks since boot). "" if /proc does not tell.
func selfProcess() string {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return ""
	}
	start, _, err := procStat(os.Getpid())
	if err != nil {
		return ""
	}
	return strings.Join([]string{strings.TrimSpace(string(boot)), ns, strconv.Itoa(os.Getpid()), start}, " ")
}

// processState checks the process a mark names (selfProcess's form).
func processState(p string) procState {
	f := strings.Fields(p)
	me := strings.Fields(selfProcess())
	if len(f) != 4 || len(me) != 4 || f[0] != me[0] || f[1] != me[1] {
		return processUnknown
	}
	pid, err := strconv.Atoi(f[2])
	if err != nil || pid <= 0 {
		return processUnknown
	}
	// kill 0 sees every process of the namespace, where /proc may hide
	// another user's (hidepid).
	if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) {
		return processDead
	}
	start, state, err := procStat(pid)
	switch {
	case err != nil:
		return processUnknown
	case start != f[3], state == "Z", state == "X":
		return processDead // another process under a reused pid, or a zombie
	}
	return processAlive
}

// procStat returns the start time and state of a process from
// /proc/PID/stat.
func procStat(pid int) (start, state string, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", "", err
	}
	// The command name (field 2) is in parentheses and may hold anything.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return "", "", fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return "", "", fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	return f[19], f[0], nil // fields 22 and 3
}
