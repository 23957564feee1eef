// Command calc is the off-by-one candidate (`bad`) that, after each
// answer, writes newlines to its standard output until a write fails (the
// file size limit, or no space left), hoping that the file the grader
// keeps its answer in fills the grader's scratch space, that the grader's
// report can then not be written, and that the run ends inconclusive
// rather than failed.
package main

import (
	"fmt"
	"os"
	"strconv"
)

func fib(n int) int {
	a, b := 1, 1
	for range n {
		a, b = b, a+b
	}
	return a
}

func flood() {
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = '\n'
	}
	for {
		if _, err := os.Stdout.Write(chunk); err != nil {
			return
		}
	}
}

func main() {
	if len(os.Args) < 3 {
		os.Exit(2)
	}
	x, _ := strconv.Atoi(os.Args[2])
	switch os.Args[1] {
	case "add":
		y, _ := strconv.Atoi(os.Args[3])
		fmt.Println(x + y)
	case "fib":
		fmt.Println(fib(x))
	default:
		os.Exit(2)
	}
	flood()
}
