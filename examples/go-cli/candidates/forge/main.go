// Command calc answers wrongly and tries every way it has to make the
// grader report success instead: overwrite the report, write into the
// grader's descriptors through /proc, signal the grader, print TAP lines.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

func main() {
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
