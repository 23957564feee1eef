// Package calc is a candidate with an off-by-one bug.
package calc

// Add returns a+b.
func Add(a, b int) int { return a + b }

// Fib returns the n-th Fibonacci number (wrongly: it starts at 1).
func Fib(n int) int {
	a, b := 1, 1
	for range n {
		a, b = b, a+b
	}
	return a
}
