// Package calc is the candidate solution.
package calc

// Add returns a+b.
func Add(a, b int) int { return a + b }

// Fib returns the n-th Fibonacci number.
func Fib(n int) int {
	a, b := 0, 1
	for range n {
		a, b = b, a+b
	}
	return a
}
