// Command sandboxd-shim is the in-container helper of sandboxd (see
// internal/shim/helper). It is built statically (CGO_ENABLED=0) and
// installed next to the sandboxd binary, which copies it into a read-only
// engine volume.
package main

import (
	"os"

	"github.com/sandboxd/sandboxd/internal/shim/helper"
)

func main() { os.Exit(helper.Main(os.Args)) }
