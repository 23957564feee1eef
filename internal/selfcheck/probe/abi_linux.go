package probe

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ABIAttempt is what became of a syscall made through another ABI than
// the process's own (the i386 one, int $0x80, from an amd64 process):
// "allowed" when the kernel answered it (getpid's answer was the pid),
// "killed" when the calling thread was gone without returning (seccomp's
// answer to an architecture its filter does not name), "fault: …" when
// the call faulted (a kernel without that ABI), "panic: …" when the
// probe's own goroutine failed otherwise, "signal NAME" when the
// process died of a signal, an errno's name ("EPERM"), or "returned N".
type ABIAttempt struct {
	ABI     string `json:"abi"`
	Outcome string `json:"outcome"`
}

// Refused reports whether the attempt was seen refused: the calling
// thread killed, an errno, the process killed by seccomp's SIGSYS, or the
// call faulted. An attempt
// allowed, or one the probe could not make or watch, is not.
func (a ABIAttempt) Refused() bool {
	switch o := a.Outcome; {
	case a.ABI == "":
		return true // no foreign ABI on this architecture
	case o == "killed", o == "signal SIGSYS", strings.HasPrefix(o, "fault: "):
		// A thread or process seccomp killed, a kernel's fault. Another
		// signal (SIGKILL of an out-of-memory kill, say) says nothing of
		// the call.
		return true
	default:
		return strings.HasPrefix(o, "E") && !strings.ContainsAny(o, " :")
	}
}

// ABIChildArg is the argument that makes the probe program the child of
// TryForeignABI (ForeignABIChild).
const ABIChildArg = "abi-child"

// TryForeignABI runs the attempt in a child process of this program
// (argv: self, childArg), since the answer may be the death of a thread or
// of the process.
func TryForeignABI(self, childArg string) ABIAttempt {
	a := ABIAttempt{ABI: ForeignABI}
	if ForeignABI == "" {
		a.Outcome = "no foreign ABI on " + runtime.GOARCH
		return a
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, self, childArg)
	cmd.Stdout = &out
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		a.Outcome = strings.TrimSpace(out.String())
	case errors.As(err, &ee) && ctx.Err() == nil:
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			a.Outcome = "signal " + unix.SignalName(ws.Signal())
		} else {
			a.Outcome = fmt.Sprintf("child failed: %v: %s", err, strings.TrimSpace(out.String()))
		}
	default:
		a.Outcome = fmt.Sprintf("child failed: %v", err)
	}
	return a
}

// ForeignABIChild makes the attempt and writes its outcome to w: getpid
// through the foreign ABI, on a thread of its own that is never unlocked
// (it may be killed), watched through /proc/self/task until it either
// returns or is gone.
func ForeignABIChild(w io.Writer) {
	// The call is made from assembly, outside the runtime's syscall
	// bookkeeping: a thread killed in it dies holding its P. Another P
	// must be left for the watcher, and no collection may wait for the
	// dead one to stop (setting GOMAXPROCS also ends its updates from
	// the cgroup's limit, each of which would stop the world).
	runtime.GOMAXPROCS(max(2, runtime.GOMAXPROCS(0)))
	debug.SetGCPercent(-1)
	debug.SetMemoryLimit(math.MaxInt64)
	tids := make(chan int, 1)
	start := make(chan struct{})
	done := make(chan int64, 1)
	faulted := make(chan string, 1)
	go func() {
		runtime.LockOSThread()
		// A kernel without the ABI answers with a general protection
		// fault (SIGSEGV), which the runtime would take for its own
		// crash: here it is a panic, recovered.
		debug.SetPanicOnFault(true)
		defer func() {
			if e := recover(); e != nil {
				faulted <- panicOutcome(e)
			}
		}()
		tids <- unix.Gettid()
		<-start
		done <- foreignGetpid()
	}()
	task := fmt.Sprintf("/proc/self/task/%d", <-tids)
	// The thread must be seen alive first, or a /proc that shows nothing
	// would read as its death.
	if _, err := os.ReadFile(task + "/stat"); err != nil || threadGone(task) {
		fmt.Fprintf(w, "cannot watch the thread: %v\n", err)
		return
	}
	close(start)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case r := <-done:
			switch {
			case r == int64(os.Getpid()):
				fmt.Fprintln(w, "allowed")
			case r < 0:
				fmt.Fprintln(w, errnoName(syscall.Errno(-r)))
			default:
				fmt.Fprintln(w, "returned "+strconv.FormatInt(r, 10))
			}
			return
		case outcome := <-faulted:
			fmt.Fprintln(w, outcome)
			return
		case <-tick.C:
			// The thread also exits once it has answered (it stays
			// locked): only a thread gone without an answer was killed.
			// Its answer is sent before it exits, so one not waiting
			// here now was never sent.
			if threadGone(task) && len(done) == 0 && len(faulted) == 0 {
				fmt.Fprintln(w, "killed")
				return
			}
		}
	}
}

// threadGone reports whether the thread whose /proc/self/task directory is
// task has exited: the directory is gone, or the thread is a zombie.
func threadGone(task string) bool {
	b, err := os.ReadFile(task + "/stat")
	if errors.Is(err, os.ErrNotExist) {
		return true
	}
	// "tid (comm) S ...": the state follows the last ')'.
	i := bytes.LastIndexByte(b, ')')
	return err == nil && i >= 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X')
}

// panicOutcome is the outcome of the attempt's goroutine panicking with e:
// only a memory fault's panic (one that carries the faulting address) is
// the kernel's answer to an ABI it lacks; any other is the probe's own
// failure, never a refusal (ABIAttempt.Refused).
func panicOutcome(e any) string {
	if _, ok := e.(interface{ Addr() uintptr }); ok {
		return "fault: " + fmt.Sprint(e)
	}
	return "panic: " + fmt.Sprint(e)
}
