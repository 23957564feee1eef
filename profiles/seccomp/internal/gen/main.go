// Command gen writes sandboxd's seccomp profile (see package seccomp). It
// is internal: go generate in profiles/seccomp runs it; no other module
// installs it.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/sandboxd/sandboxd/profiles/seccomp"
)

func main() {
	out := flag.String("o", "sandboxd.json", "output file")
	flag.Parse()
	b, err := seccomp.Generate()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := os.WriteFile(*out, b, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
