package helper

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/shim"
)

// ExecSocket is the abstract unix socket of the exec service. Abstract
// sockets belong to the network namespace, so each sandbox has its own.
const ExecSocket = "@sandboxd-exec"

// ExecRequest asks the helper to run a program as the code uid with the
// caller's standard descriptors (sent alongside as SCM_RIGHTS).
type ExecRequest struct {
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
}

// ExecReply is the program's exit.
type ExecReply struct {
	ExitCode int    `json:"exit_code"`
	Error    string `json:"error,omitempty"`
}

// maxExecInFlight bounds the programs the service runs at once.
const maxExecInFlight = 64

// execService runs programs for the command as a second, separate uid:
// the code uid. A grader that runs the candidate's program through it (for
// example `go test -exec "/.sandboxd/shim exec"`, or `shim exec PROG` in a
// script) keeps that program away from its own files, its /proc entries
// and its report: the program cannot write what the grader's uid owns,
// open the grader's descriptors or signal it. Anyone in the sandbox may
// use the service; it only ever starts code-uid processes.
//
// Each program runs in a session of its own, and its session ends with
// its client: when the client's connection closes (it exited, or a
// grader's `timeout` killed it), the service kills every process of the
// program's session, so a hung program cannot hold the client's pipes open
// until the job's wall time; and when the program exits, what it left
// running in its session is killed too. A process that starts a session of
// its own escapes that, not the end of the call: then every process of the
// code uid outside the sessions of the calls still in flight is killed
// before the call returns, so nothing a program left, however it detached,
// outlives its call (and a detached process cannot keep itself alive by
// making a call of its own: it is not in that call's session).
type execService struct {
	cfg  *shim.Config
	self string // the helper's binary: each program starts through its codeStart
	ln   *net.UnixListener
	wg   sync.WaitGroup
	sem  chan struct{}
	done chan struct{}

	mu       sync.Mutex
	stopped  bool         // no program starts any more
	started  bool         // some program was (or is being) started as the code uid
	inFlight map[int]bool // the sessions (their leaders' pids) of the calls in flight
}

func startExecService(cfg *shim.Config) (*execService, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("exec service: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: ExecSocket, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("exec service: %w", err)
	}
	s := &execService{cfg: cfg, self: self, ln: ln, sem: make(chan struct{}, maxExecInFlight), done: make(chan struct{})}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

func (s *execService) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			return
		}
		select {
		case s.sem <- struct{}{}:
		default:
			c.Close() // too many at once
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-s.sem }()
			s.serve(c)
		}()
	}
}

// stop refuses new requests; running programs are ended by the kill of
// the code uid, after which serve returns. After stop, used is final.
func (s *execService) stop() {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.ln.Close()
}

// used reports whether a process of the code uid may exist: whether a
// program was started, or is being started, as that uid. A nil service
// never starts one.
func (s *execService) used() bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.started
}

// wait waits for every request to end (after the code uid was killed).
func (s *execService) wait() { s.wg.Wait() }

func (s *execService) serve(c *net.UnixConn) {
	defer c.Close()
	reply := func(r ExecReply) {
		b, _ := json.Marshal(r)
		c.Write(b)
	}
	buf := make([]byte, 256<<10)
	oob := make([]byte, unix.CmsgSpace(3*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return
	}
	files, err := receiveFDs(oob[:oobn])
	for _, f := range files {
		defer f.Close()
	}
	if err != nil {
		reply(ExecReply{ExitCode: 126, Error: err.Error()})
		return
	}
	var req ExecRequest
	if err := json.Unmarshal(buf[:n], &req); err != nil || len(req.Argv) == 0 || req.Argv[0] == "" {
		reply(ExecReply{ExitCode: 126, Error: "malformed exec request"})
		return
	}
	path := req.Argv[0]
	if !strings.Contains(path, "/") {
		path = lookPath(path, req.Env)
	}
	cmd := &exec.Cmd{
		Path: s.self, Args: append([]string{s.self, codeStart, path}, req.Argv...), Env: withTmpdir(req.Env, s.cfg.CodeTmp), Dir: req.Dir,
		Stdin: files[0], Stdout: files[1], Stderr: files[2],
		SysProcAttr: &syscall.SysProcAttr{
			Credential: &syscall.Credential{Uid: uint32(s.cfg.CodeUID), Gid: uint32(s.cfg.CodeGID), Groups: []uint32{}},
			Setsid:     true,
			Pdeathsig:  syscall.SIGKILL,
		},
	}
	// Marked before the start, under the lock stop takes: once stop
	// returns, either used reports this program or it never starts. The
	// start and its session's record are one step under the lock a call's
	// end takes to kill what is outside the sessions in flight.
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		reply(ExecReply{ExitCode: 126, Error: "the job's command has ended"})
		return
	}
	s.started = true
	if err := cmd.Start(); err != nil {
		s.mu.Unlock()
		reply(ExecReply{ExitCode: 127, Error: err.Error()})
		return
	}
	if s.inFlight == nil {
		s.inFlight = map[int]bool{}
	}
	s.inFlight[cmd.Process.Pid] = true
	s.mu.Unlock()
	for _, f := range files {
		f.Close() // the program holds them now
	}
	pid := cmd.Process.Pid // its session's id (Setsid)
	gone, exited := make(chan struct{}), make(chan struct{})
	go func() {
		io.Copy(io.Discard, c) // the client sends nothing more: this ends when it goes
		close(gone)
	}()
	go func() {
		waitExited(pid)
		close(exited)
	}()
	select {
	case <-gone:
		s.endSession(pid)
		<-exited
	case <-exited:
	}
	// Not reaped until cmd.Wait: the session's id is not reused meanwhile
	// (nor, so, the record of the calls in flight).
	s.endSession(pid)
	s.callEnded(pid)
	werr := cmd.Wait()
	code, _ := exitStatus(cmd.ProcessState, werr)
	reply(ExecReply{ExitCode: code})
}

// callEnded ends the call whose program led session sid: every live
// process of the code uid outside the sessions of the calls still in
// flight (what escaped its own session) is killed before the reply, and
// reaped: a dead process not yet reaped holds its place in the pids
// cgroup, and a bomb's dead left the grader no fork after the call
// (hostile case exec-detached-fork-bomb). With no other call in flight,
// every process of the code uid is a stray, and they are killed by one
// kill(-1) as that uid (killAllOf), a walk under the lock fork takes: a
// bomb whose every process forks, each child in a session of its own,
// slipped past kills by pid, its children made between the listing and
// the kill. It holds the lock a start takes, so no program of a new call
// starts meanwhile. After stop, the job's end kills the code uid.
func (s *execService) callEnded(sid int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.inFlight, sid)
	if s.stopped {
		return
	}
	if len(s.inFlight) > 0 {
		// Other calls' programs run, which kill(-1) would take too: the
		// strays go by pid, in rounds while any is alive, and are not
		// waited for (a program of another call may make them as fast as
		// they die; its own call's end takes them).
		for range 100 {
			alive := strayPIDs(s.cfg.CodeUID, s.inFlight)
			if len(alive) == 0 {
				return
			}
			asUID(s.cfg.CodeUID, func() {
				for _, pid := range alive {
					unix.Kill(pid, unix.SIGKILL)
				}
			})
		}
		return
	}
	// No other call: every process of the code uid is a stray. Each round
	// kills them all by kill(-1) as that uid, whatever a listing of /proc,
	// racing a bomb, missed; rounds go on while any is there, alive or not
	// yet reaped, for up to two seconds. The call's own leader is reaped
	// after this (serve's cmd.Wait).
	for deadline := time.Now().Add(2 * time.Second); ; {
		if err := killAllOf(s.cfg.CodeUID); err != nil {
			fmt.Fprintln(os.Stderr, "sandboxd-shim exec:", err)
		}
		if !straysLeft(s.cfg.CodeUID, s.inFlight, sid) || time.Now().After(deadline) {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// strayPIDs lists the live (non-zombie) processes whose real uid is uid
// and whose session is none of keep.
func strayPIDs(uid int, keep map[int]bool) []int {
	var out []int
	for _, pid := range pidsOf(uid) {
		if state, sid, ok := stateAndSession(pid); ok && !dead(state) && !keep[sid] {
			out = append(out, pid)
		}
	}
	return out
}

// straysLeft reports whether a process of uid outside the sessions of
// keep is still there, alive or a zombie (which holds its place in the
// pids cgroup until it is reaped), but except.
func straysLeft(uid int, keep map[int]bool, except int) bool {
	for _, pid := range pidsOf(uid) {
		if _, sid, ok := stateAndSession(pid); ok && pid != except && !keep[sid] {
			return true
		}
	}
	return false
}

// stateAndSession reads a process's state and session from its stat.
func stateAndSession(pid int) (state string, sid int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0, false // gone
	}
	// pid (comm) state ppid pgrp session ...; comm may hold anything.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 4 {
		return "", 0, false
	}
	sid, err = strconv.Atoi(f[3])
	return f[0], sid, err == nil
}

// dead reports whether a process state is a zombie's or a dead one's.
func dead(state string) bool { return state == "Z" || state == "X" }

// codeStart is the helper's command that starts a program of the code uid
// (codeStartMain).
const codeStart = "code-start"

// codeOOMScoreAdj is the code uid's programs' oom_score_adj: above the
// job's own (the broker's spec gives every process of the sandbox 500), so
// that where the job's memory runs out, the kernel kills a program of the
// code uid, the candidate's code a grader runs, before the grader or the
// helper, unless one of those holds half the job's memory more than it.
// At 1000 all, the biggest went, and a candidate's program that forked a
// crowd of small children past the limit had the helper killed (no
// status: the engine's word, the grader job oom_killed, inconclusive).
const codeOOMScoreAdj = "1000"

// codeStartMain runs as the code uid, in the process the exec service
// started: it raises its own oom_score_adj (raising needs no privilege)
// and becomes the program, args[0] with argv args[1:]. A program that
// could not be given that score does not run.
func codeStartMain(args []string) int {
	if len(args) < 2 {
		fmt.Fprintln(os.Stderr, "sandboxd-shim code-start: no program")
		return 126
	}
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte(codeOOMScoreAdj), 0); err != nil {
		fmt.Fprintln(os.Stderr, "sandboxd-shim code-start: oom_score_adj:", err)
		return 126
	}
	err := unix.Exec(args[0], args[1:], os.Environ())
	fmt.Fprintf(os.Stderr, "sandboxd-shim code-start: %s: %v\n", args[0], err)
	return 127
}

// waitExited waits until process pid has exited, without reaping it.
func waitExited(pid int) {
	var info unix.Siginfo
	for {
		if err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != unix.EINTR {
			return
		}
	}
}

// endSession kills every live process of session sid, from a thread of
// the helper that takes the code uid (asUID; the helper holds no
// CAP_KILL), until none is left (a fork races the scan) or it gave up.
func (s *execService) endSession(sid int) {
	me := os.Getpid()
	for range 100 {
		if !sessionAlive(sid, me) {
			return
		}
		asUID(s.cfg.CodeUID, func() {
			unix.Kill(-sid, unix.SIGKILL) // its leader's process group
			for _, pid := range sessionPIDs(sid, me) {
				unix.Kill(pid, unix.SIGKILL)
			}
		})
	}
}

func sessionAlive(sid, except int) bool { return len(sessionPIDs(sid, except)) > 0 }

// sessionPIDs lists the live (non-zombie) processes of session sid but
// except.
func sessionPIDs(sid, except int) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == except {
			continue
		}
		if state, s, ok := stateAndSession(pid); ok && !dead(state) && s == sid {
			pids = append(pids, pid)
		}
	}
	return pids
}

func receiveFDs(oob []byte) ([]*os.File, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("exec request: %w", err)
	}
	var fds []int
	for _, m := range msgs {
		r, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		fds = append(fds, r...)
	}
	files := make([]*os.File, 0, len(fds))
	for i, fd := range fds {
		files = append(files, os.NewFile(uintptr(fd), fmt.Sprintf("fd%d", i)))
	}
	if len(files) != 3 {
		return files, errors.New("exec request: want exactly stdin, stdout and stderr")
	}
	return files, nil
}

// execMain is `shim exec PROG [ARG...]`: run PROG as the code uid through
// the helper's exec service, with this process's environment (but
// $TMPDIR: the code uid's own tmpfs), working directory and standard
// descriptors, and exit as it exited.
func execMain(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: /.sandboxd/shim exec PROG [ARG...]")
		return 2
	}
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: ExecSocket, Net: "unix"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandboxd exec:", err)
		return 126
	}
	defer c.Close()
	dir, _ := os.Getwd()
	req, _ := json.Marshal(ExecRequest{Argv: args, Env: os.Environ(), Dir: dir})
	if _, _, err := c.WriteMsgUnix(req, unix.UnixRights(0, 1, 2), nil); err != nil {
		fmt.Fprintln(os.Stderr, "sandboxd exec:", err)
		return 126
	}
	var rep ExecReply
	if err := json.NewDecoder(c).Decode(&rep); err != nil {
		fmt.Fprintln(os.Stderr, "sandboxd exec: no reply:", err)
		return 126
	}
	if rep.Error != "" {
		fmt.Fprintln(os.Stderr, "sandboxd exec:", rep.Error)
	}
	return rep.ExitCode
}

// withTmpdir is env with TMPDIR set to dir (the code uid's own tmpfs, the
// one scratch space it may write), replacing the caller's; env itself if
// dir is "".
func withTmpdir(env []string, dir string) []string {
	if dir == "" {
		return env
	}
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if !strings.HasPrefix(kv, "TMPDIR=") {
			out = append(out, kv)
		}
	}
	return append(out, "TMPDIR="+dir)
}
