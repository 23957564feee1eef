package helper

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/shim"
)

// Main is the helper's entry point; it returns the process exit code.
func Main(args []string) int {
	if len(args) > 1 {
		switch args[1] {
		case "stage":
			return stageMain()
		case "collect":
			return collectMain()
		case "exec":
			return execMain(args[2:])
		case codeStart:
			return codeStartMain(args[2:])
		}
	}
	if os.Getpid() == 1 {
		return initMain(args)
	}
	// The kill (asUID) locks its goroutine to a thread, and the runtime's
	// first LockOSThread starts a template thread: with a bomb filling the
	// pids cgroup that start failed ("failed to create new OS thread",
	// fatal, CI22). It is started now, while nothing of the job runs.
	runtime.LockOSThread()
	runtime.UnlockOSThread()
	return parentMain()
}

// initMain runs when the helper is the container's first process (an
// engine without an init of its own, such as containerd): it starts the
// helper again as its child, hands it the stdio, reaps every orphan as an
// init must, and exits with the helper's status.
func initMain(args []string) int {
	self, err := os.Executable()
	if err != nil {
		self = args[0]
	}
	cmd := exec.Command(self)
	cmd.Args = args
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "sandboxd-shim init:", err)
		return 1
	}
	// Only the helper holds the result channel from here on.
	if null, err := unix.Open("/dev/null", unix.O_RDWR, 0); err == nil {
		for fd := 0; fd <= 2; fd++ {
			unix.Dup2(null, fd)
		}
		unix.Close(null)
	}
	child := cmd.Process.Pid
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 1
		}
		if pid != child {
			continue
		}
		if ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ws.ExitStatus()
	}
}

// out serialises frames on the result channel.
type out struct {
	mu sync.Mutex
	w  io.Writer
}

func (o *out) frame(typ byte, p []byte) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return shim.WriteFrame(o.w, typ, p)
}

func (o *out) json(typ byte, v any) error {
	b, err := shim.MarshalFrame(v)
	if err != nil {
		return err
	}
	return o.frame(typ, b)
}

func parentMain() int {
	o := &out{w: shim.NewStuffWriter(os.Stdout)}
	nonce := os.Getenv(shim.NonceEnv)
	os.Unsetenv(shim.NonceEnv)
	if err := o.frame(shim.FrameHello, []byte(shim.Hello+nonce)); err != nil {
		return 1
	}
	// Before anything runs the candidate's code (fail closed: no filter,
	// no job).
	if err := denyClone3(); err != nil {
		o.frame(shim.FrameError, []byte(err.Error()))
		return 1
	}
	st, err := runJob(o)
	if err != nil {
		o.frame(shim.FrameError, []byte(err.Error()))
		return 1
	}
	if err := o.json(shim.FrameStatus, st); err != nil {
		return 1
	}
	return 0
}

func readConfig(r io.Reader) (*shim.Config, error) {
	fr := shim.NewFrameReader(r)
	typ, p, err := fr.Next()
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	if typ != shim.FrameConfig {
		return nil, fmt.Errorf("first frame is %q, want config", typ)
	}
	var c shim.Config
	dec := json.NewDecoder(strings.NewReader(string(p)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("decode config: %w", err)
	}
	if len(c.Argv) == 0 || c.UID <= 0 || c.GID <= 0 {
		return nil, errors.New("config: empty argv or root candidate")
	}
	if c.CodeUID < 0 || c.CodeGID < 0 || (c.CodeUID > 0 && (c.CodeUID == c.UID || c.CodeGID == 0 || c.CodeGID == c.GID)) {
		return nil, errors.New("config: the code uid must be another non-root uid, in another group than the candidate's")
	}
	return &c, nil
}

func candidateCred(c *shim.Config) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: uint32(c.UID), Gid: uint32(c.GID), Groups: []uint32{}},
		Setsid:     true,
		Pdeathsig:  syscall.SIGKILL,
	}
}

func self() string {
	p, err := os.Executable()
	if err != nil {
		return os.Args[0]
	}
	return p
}

func runJob(o *out) (*shim.Status, error) {
	cfg, err := readConfig(os.Stdin)
	if err != nil {
		return nil, err
	}
	if err := checkScratch(cfg.Scratch); err != nil {
		return nil, err
	}
	if err := closeScratch(cfg); err != nil {
		return nil, err
	}
	cfgJSON, _ := json.Marshal(cfg)

	// Stage: extract writable inputs as the candidate user, reading the
	// rest of stdin, and make the directories the job names. Nothing of the
	// candidate has run yet: with no inputs and every directory already
	// there (the scratch mount points), there is nothing to stage.
	if len(cfg.Inputs) > 0 || !allDirs(cfg.MakeDirs) {
		stage := exec.Command(self(), "stage")
		stage.Stdin = os.Stdin
		stage.Stdout = os.Stderr
		stage.Stderr = os.Stderr
		stage.SysProcAttr = candidateCred(cfg)
		if err := runChild(stage, cfgJSON); err != nil {
			return nil, fmt.Errorf("stage inputs: %w", err)
		}
	}

	st := &shim.Status{ScratchUsed: map[string]int64{}, LimitsHit: []string{}}
	start := time.Now()
	cmd, err := command(cfg)
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	cmd.Stdin = devnull
	var relays sync.WaitGroup
	relay := func(r *os.File, typ byte, total *int64) {
		defer relays.Done()
		buf := make([]byte, 64<<10)
		var sent int64
		for {
			n, err := r.Read(buf)
			if n > 0 {
				*total += int64(n)
				if keep := min(int64(n), cfg.LogBytes-sent); keep > 0 {
					o.frame(typ, buf[:keep])
					sent += keep
				}
			}
			if err != nil {
				return
			}
		}
	}
	relays.Add(2)
	go relay(outR, shim.FrameStdout, &st.StdoutTotal)
	go relay(errR, shim.FrameStderr, &st.StderrTotal)

	var svc *execService
	if cfg.CodeUID > 0 {
		if svc, err = startExecService(cfg); err != nil {
			return nil, err
		}
	}
	var startMsg int64
	pidsRefusedBefore, pidsCounted := pidsRefused()
	oomKillsBefore, oomCounted := oomKills()
	// Written before the command starts: a stream without it proves that
	// nothing of the candidate ran, and a recovering broker runs the job
	// for the first time (broker.ErrNotRun).
	if err := o.frame(shim.FrameStarting, nil); err != nil {
		return nil, err
	}
	startErr := cmd.Start()
	outW.Close()
	errW.Close()
	devnull.Close()
	if startErr != nil {
		// The command could not start (missing binary, bad workdir): report
		// it as the command's failure, like a shell would (127).
		st.ExitCode = 127
		msg := fmt.Sprintf("sandboxd: cannot start %q: %v\n", cfg.Argv[0], startErr)
		startMsg = int64(len(msg))
		o.frame(shim.FrameStderr, []byte(msg))
	} else {
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		var timer <-chan time.Time
		if cfg.DeadlineMS > 0 {
			t := time.NewTimer(time.Duration(cfg.DeadlineMS) * time.Millisecond)
			defer t.Stop()
			timer = t.C
		}
		var werr error
		select {
		case werr = <-done:
		case <-timer:
			st.TimedOut = true
			killCandidates(cfg, svc.used()) // as the candidate uid; the helper holds no CAP_KILL
			werr = <-done
		}
		st.ExitCode, st.Signal = exitStatus(cmd.ProcessState, werr)
		if st.Signal == "SIGXFSZ" {
			st.LimitsHit = append(st.LimitsHit, "file_size_bytes")
		}
	}
	st.DurationMS = time.Since(start).Milliseconds()

	// Kill what the command left behind, then drain its pipes: with every
	// candidate process dead, the relays reach EOF.
	if svc != nil {
		svc.stop()
	}
	if !killCandidates(cfg, svc.used()) {
		st.Leftover = true
		st.Error = "candidate processes survived SIGKILL; outputs not collected"
		return st, nil
	}
	relays.Wait()
	if svc != nil {
		svc.wait() // every program it ran is dead
	}
	// A fork the pids limit refused while the command ran was the
	// candidate's: the helper forks nothing meanwhile. Not so once the exec
	// service ran a program of the code uid: whose fork it was cannot be
	// told, and the code uid's doing must not mark the grader's job.
	// The same for a process the memory limit killed.
	st.CodeUIDRan = svc.used()
	if n, ok := oomKills(); ok && oomCounted && n > oomKillsBefore && !st.CodeUIDRan {
		st.OOMKilled = true
	}
	if n, ok := pidsRefused(); ok && pidsCounted && n > pidsRefusedBefore && !svc.used() {
		st.LimitsHit = append(st.LimitsHit, "pids")
	}
	st.StderrTotal += startMsg // counted after the relays stopped writing the totals
	outR.Close()
	errR.Close()
	if st.StdoutTotal > cfg.LogBytes || st.StderrTotal > cfg.LogBytes {
		st.LimitsHit = append(st.LimitsHit, "log_bytes")
	}
	for _, dir := range cfg.Scratch {
		var fs unix.Statfs_t
		if err := unix.Statfs(dir, &fs); err == nil {
			used := int64(fs.Blocks-fs.Bfree) * fs.Bsize
			st.ScratchUsed[dir] = used
			if fs.Bavail == 0 && !slices.Contains(st.LimitsHit, "disk_bytes") {
				st.LimitsHit = append(st.LimitsHit, "disk_bytes")
			}
		}
	}

	// Collect outputs as the candidate uid, now that no candidate process
	// remains; the collector writes its frames straight to our stdout, and
	// nothing else writes meanwhile. Where it would find nothing (looked at
	// as that uid), its summary is written here without a process start:
	// one static-binary start fewer per such job, and no fork needed from
	// a pids cgroup a candidate may have filled.
	if nothingToCollect(cfg) {
		if err := o.json(shim.FrameCollected, emptyCollection()); err != nil {
			return nil, fmt.Errorf("collect outputs: %w", err)
		}
		return st, nil
	}
	coll := exec.Command(self(), "collect")
	coll.Stdout = os.Stdout
	coll.Stderr = os.Stderr
	coll.SysProcAttr = candidateCred(cfg)
	o.mu.Lock()
	err = runChild(coll, cfgJSON)
	o.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("collect outputs: %w", err)
	}
	return st, nil
}

// checkScratch refuses scratch space that another uid could change under
// the job: a directory writable by group or others without the sticky bit
// lets any uid in the sandbox rename or unlink what the job made there
// (the code uid could replace the grader's report directory). The engine
// gives a tmpfs the mode of the image's directory it is mounted on, not
// the mode the broker asks for: an image whose /work is 0777 made /work
// 0777 (runc, measured on Docker here).
func checkScratch(dirs []string) error {
	for _, d := range dirs {
		var st unix.Stat_t
		if err := unix.Stat(d, &st); err != nil {
			return fmt.Errorf("scratch %s: %w", d, err)
		}
		if st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0 {
			return fmt.Errorf("scratch %s is mode %#o: writable by other uids without the sticky bit (the tmpfs takes the mode of the image's %s); the job does not run", d, st.Mode&0o7777, d)
		}
	}
	return nil
}

// closeScratch closes the job's scratch space to writes by every uid but
// the candidate's (and root's) where the exec service has a code uid: a
// program it runs must not fill the grader's scratch space (a full one
// made its run inconclusive: candidates fill of examples/go-cli and
// examples/python). The code uid writes in a tmpfs of its own
// (cfg.CodeTmp). A scratch directory others may write is root's /tmp (the
// engine gives a tmpfs the mode of the image's directory, 1777), whose
// group is the candidate's (the broker's mount option), and is made 1775;
// one the helper cannot close so stops the job before anything of it
// runs. What others may read stays readable, and a directory the grader
// makes writable to others in it stays so: the grader's choice to share
// its scratch space with the programs it runs.
func closeScratch(cfg *shim.Config) error {
	if cfg.CodeUID <= 0 {
		return nil
	}
	for _, d := range cfg.Scratch {
		var st unix.Stat_t
		if err := unix.Stat(d, &st); err != nil {
			return fmt.Errorf("scratch %s: %w", d, err)
		}
		if st.Mode&0o002 == 0 {
			continue // /work: the candidate's 0755 (the code uid reads what the grader puts there for it)
		}
		mode := (st.Mode & 0o7777) &^ 0o002
		var err error
		switch {
		case st.Uid == 0 && int(st.Gid) == cfg.GID:
			err = unix.Chmod(d, mode) // root's /tmp: the helper is its owner
		case int(st.Uid) == cfg.UID:
			// The candidate's own (an image's sticky 1777 /work): its owner
			// may change its mode, no capability needed.
			if aerr := asUID(cfg.UID, func() { err = unix.Chmod(d, mode) }); aerr != nil {
				err = aerr
			}
		default:
			return fmt.Errorf("scratch %s is mode %#o, owner %d:%d: open to the exec service's code uid, and neither root's with the candidate's group nor the candidate's to close; the job does not run", d, st.Mode&0o7777, st.Uid, st.Gid)
		}
		if err != nil {
			return fmt.Errorf("scratch %s: close it to other uids: %w", d, err)
		}
	}
	return nil
}

func command(cfg *shim.Config) (*exec.Cmd, error) {
	path := cfg.Argv[0]
	if !strings.Contains(path, "/") {
		path = lookPath(path, cfg.Env)
	}
	cmd := &exec.Cmd{
		Path:        path,
		Args:        cfg.Argv,
		Env:         cfg.Env,
		Dir:         cfg.WorkDir,
		SysProcAttr: candidateCred(cfg),
	}
	return cmd, nil
}

func lookPath(name string, env []string) string {
	pathVar := "/usr/local/bin:/usr/bin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathVar = v
		}
	}
	for _, dir := range filepath.SplitList(pathVar) {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p
		}
	}
	return name
}

func exitStatus(ps *os.ProcessState, err error) (int, string) {
	if ps == nil {
		return 127, ""
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		sig := ws.Signal()
		return 128 + int(sig), unix.SignalName(sig)
	}
	return ps.ExitCode(), ""
}

// killCandidates kills every process of the candidate uid, and of the code
// uid if the exec service ever ran a program (nothing else can become that
// uid), from a thread of the helper that takes that uid (killAllOf), and
// waits until none is alive. It reports false if some survived.
func killCandidates(cfg *shim.Config, codeUsed bool) bool {
	deadline := time.Now().Add(5 * time.Second)
	ids := killTargets(cfg, codeUsed)
	for {
		for _, id := range ids {
			if err := killAllOf(id[0]); err != nil {
				fmt.Fprintln(os.Stderr, "sandboxd-shim:", err)
				return false
			}
		}
		alive := false
		for _, id := range ids {
			alive = alive || anyAlive(id[0])
		}
		if !alive {
			awaitReaped(ids, deadline)
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// awaitReaped waits, until deadline, for init to reap the killed
// processes. A zombie still holds its place in the pids cgroup: with a
// bomb's dead children not yet reaped, the cgroup stayed full and the
// collector's fork failed (EAGAIN: "collect outputs: fork/exec
// /.sandboxd/shim: resource temporarily unavailable", CI). Past the
// deadline the helper goes on: they are dead, and the fork says if the
// room is still not there.
func awaitReaped(ids [][2]int, deadline time.Time) {
	for {
		left := false
		for _, id := range ids {
			left = left || anyLeft(id[0])
		}
		if !left || time.Now().After(deadline) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// killTargets is the uid and gid pairs whose processes the kill ends: the
// candidate's, and the code uid's only if the exec service started a
// program: nothing else can become that uid, so otherwise it has none.
func killTargets(cfg *shim.Config, codeUsed bool) [][2]int {
	ids := [][2]int{{cfg.UID, cfg.GID}}
	if cfg.CodeUID > 0 && codeUsed {
		ids = append(ids, [2]int{cfg.CodeUID, cfg.CodeGID})
	}
	return ids
}

// pidsRefused reads how many forks the sandbox's pids cgroup has refused
// (the "max" line of pids.events, cgroup v1 or v2, in the sandbox's own
// cgroup namespace). It reports false where there is no such file (gVisor
// enforces the pids limit as RLIMIT_NPROC).
func pidsRefused() (int64, bool) {
	return cgroupCount([]string{"/sys/fs/cgroup/pids/pids.events", "/sys/fs/cgroup/pids.events"}, "max")
}

// oomKills reads how many processes the sandbox's memory cgroup has
// killed (the "oom_kill" line of memory.oom_control on cgroup v1, of
// memory.events on v2). The engine's own word (Docker's OOMKilled) comes
// from an event that may be handled after the container's exit, and then
// reads false: a memory bomb ended "failed, killed by SIGKILL" once in CI.
func oomKills() (int64, bool) {
	return cgroupCount([]string{"/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events"}, "oom_kill")
}

// cgroupCount reads the counter key of the first of files that has it
// ("key N" lines); false where none does.
func cgroupCount(files []string, key string) (int64, bool) {
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, key+" "); ok {
				n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				return n, err == nil
			}
		}
	}
	return 0, false
}

// nothingToCollect reports whether the collector would find nothing at
// all: every output directory is a scratch directory or lies in one, and
// every scratch directory is empty. It looks as the collector would (the
// candidate's uid, on one thread: see asUID), once no process of the
// candidate or code uid is left (nothing can add an entry after it
// looked): the collector reads the outputs and scans the scratch space for
// files over the size limit, both as that uid, and with no entry there has
// nothing to read or reject. Whatever it cannot tell (a scratch directory
// the candidate's uid cannot open or list, a link on its path, a relative
// path) counts as something: the collector runs.
func nothingToCollect(cfg *shim.Config) bool {
	for _, out := range cfg.Outputs {
		if !slices.ContainsFunc(cfg.Scratch, func(dir string) bool { return within(out, dir) }) {
			return false
		}
	}
	empty := true
	// As the candidate lists them: /work is its own (its owner class),
	// /tmp is root's and open to the candidate's group.
	err := asIDs(cfg.UID, cfg.GID, func() {
		for _, dir := range cfg.Scratch {
			if !emptyDir(dir) {
				empty = false
				return
			}
		}
	})
	return err == nil && empty
}

// within reports whether path is dir or lies below it, dir being absolute.
// (sandbox.Job's own check keeps outputs below /work or /tmp; this is the
// helper's, on what it was sent.)
func within(path, dir string) bool {
	path, dir = filepath.Clean(path), filepath.Clean(dir)
	return filepath.IsAbs(dir) && (path == dir || strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/"))
}

// emptyDir reports whether dir, an absolute path reached without
// following a link, can be listed and has no entry. It makes its system
// calls on the calling thread (no os.File), so that asUID's credentials
// are the ones that list it.
func emptyDir(dir string) bool {
	if !filepath.IsAbs(dir) {
		return false
	}
	fd, err := openDirNoLinks(dir)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	buf := make([]byte, 4096)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return false
		}
		if n == 0 {
			return true
		}
		if _, count, _ := unix.ParseDirent(buf[:n], -1, nil); count > 0 { // "." and ".." are not counted
			return false
		}
	}
}

// allDirs reports whether every path is a directory already, reached
// without following a link.
func allDirs(paths []string) bool {
	for _, p := range paths {
		for q := p; q != "/" && q != "."; q = filepath.Dir(q) {
			var st unix.Stat_t
			if unix.Lstat(q, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
				return false
			}
		}
	}
	return true
}

// anyAlive reports whether a live (non-zombie) process of uid exists.
func anyAlive(uid int) bool {
	alive, _ := processesOf(uid)
	return alive
}

// anyLeft reports whether any process of uid is there at all, a zombie
// (dead, not yet reaped) included.
func anyLeft(uid int) bool {
	alive, zombie := processesOf(uid)
	return alive || zombie
}

// processesOf reports whether uid has a live process and whether it has a
// zombie. A process table it cannot read counts as a live process.
func processesOf(uid int) (alive, zombie bool) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return true, false
	}
	me := os.Getpid()
	for _, e := range ents {
		pid := 0
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil || pid == me {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		var state string
		var ruid int = -1
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "State:"); ok {
				state = strings.TrimSpace(v)
			}
			if v, ok := strings.CutPrefix(line, "Uid:"); ok {
				fmt.Sscanf(strings.TrimSpace(v), "%d", &ruid)
			}
		}
		if ruid != uid {
			continue
		}
		if strings.HasPrefix(state, "Z") || strings.HasPrefix(state, "X") {
			zombie = true
		} else {
			alive = true
		}
	}
	return alive, zombie
}

// configFD is the descriptor on which a helper child (stage, collect)
// reads the job's configuration. It came in an environment variable, one
// string, which the kernel bounds (MAX_ARG_STRLEN, 128 KiB): a job whose
// argv and environment alone were larger ended error at staging ("argument
// list too long").
const configFD = 3

// maxChildConfig bounds what a child reads there: a job (its argv and
// environment bounded by sandbox.Job's validation) with the broker's
// additions.
const maxChildConfig = 64 << 20

// runChild runs a helper child with cfgJSON on configFD. The child reads
// it whole before anything else; one that exits first ends the write
// (EPIPE), so nothing waits on a reader that is gone.
func runChild(cmd *exec.Cmd, cfgJSON []byte) error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd.Env = []string{}
	cmd.ExtraFiles = []*os.File{r}
	err = cmd.Start()
	r.Close()
	if err != nil {
		w.Close()
		return err
	}
	_, werr := w.Write(cfgJSON)
	w.Close()
	if err := cmd.Wait(); err != nil {
		return err
	}
	if werr != nil {
		return fmt.Errorf("send the child its config: %w", werr)
	}
	return nil
}

func childConfig() (*shim.Config, error) {
	f := os.NewFile(configFD, "config")
	if f == nil {
		return nil, errors.New("child config: no descriptor 3")
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxChildConfig+1))
	if err != nil {
		return nil, fmt.Errorf("child config: %w", err)
	}
	if len(b) > maxChildConfig {
		return nil, fmt.Errorf("child config: over %d bytes", maxChildConfig)
	}
	var c shim.Config
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("child config: %w", err)
	}
	return &c, nil
}
