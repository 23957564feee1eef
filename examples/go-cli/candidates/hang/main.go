// Command calc is a candidate that hangs on a large fib, holding its
// stdout open: `calc add A B` and `calc fib N`.
package main

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

func fib(n int) int {
	a, b := 0, 1
	for range n {
		a, b = b, a+b
	}
	return a
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
		if x > 50 {
			time.Sleep(24 * time.Hour) // never answers, never closes stdout
		}
		fmt.Println(fib(x))
	default:
		os.Exit(2)
	}
}
