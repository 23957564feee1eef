// Command sandboxd-hook is the OCI prestart hook of sandboxd's containerd
// engine. `sandboxd-hook loopback-up` brings up lo in the new network
// namespace of the container whose state the runtime passes on stdin: a
// new namespace holds only lo, and it is down (Docker's none network
// brings it up; runc does not). It touches no other interface and no other
// namespace. It is built statically (CGO_ENABLED=0) and installed next to
// the sandboxd binary.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) != 2 || os.Args[1] != "loopback-up" {
		fmt.Fprintln(os.Stderr, "usage: sandboxd-hook loopback-up < OCI state")
		os.Exit(2)
	}
	if err := loopbackUp(os.Stdin); err != nil {
		fmt.Fprintln(os.Stderr, "sandboxd-hook:", err)
		os.Exit(1)
	}
}

func loopbackUp(r io.Reader) error {
	var state struct {
		Pid int `json:"pid"`
	}
	if err := json.NewDecoder(io.LimitReader(r, 1<<20)).Decode(&state); err != nil {
		return fmt.Errorf("read the container state: %w", err)
	}
	if state.Pid <= 0 {
		return fmt.Errorf("container state has no pid")
	}
	ns, err := unix.Open(fmt.Sprintf("/proc/%d/ns/net", state.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open the network namespace: %w", err)
	}
	defer unix.Close(ns)
	// This thread enters the container's namespace and never leaves: the
	// process exits right after.
	runtime.LockOSThread()
	if err := unix.Setns(ns, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("enter the network namespace: %w", err)
	}
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(s)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(s, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(s, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring lo up: %w", err)
	}
	return nil
}
