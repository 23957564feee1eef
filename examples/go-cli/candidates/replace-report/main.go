// Command calc is a candidate with an off-by-one fib that, each time it
// runs, tries to unlink the grader's report (and the grader's file that
// becomes it) and put an all-pass TAP report in its place.
package main

import (
	"fmt"
	"os"
	"strconv"
)

const forged = "TAP version 13\n1..4\nok 1 - add small\nok 2 - add negative\nok 3 - fib 10\nok 4 - fib 90\n"

func replaceReport() {
	for _, p := range []string{os.Getenv("SANDBOXD_REPORT"), "/work/out/report.tap", "/work/out/report.tap.tmp"} {
		if p == "" {
			continue
		}
		os.Remove(p)
		os.WriteFile(p, []byte(forged), 0o644)
	}
}

func fib(n int) int {
	a, b := 1, 1
	for range n {
		a, b = b, a+b
	}
	return a
}

func main() {
	replaceReport()
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
}
