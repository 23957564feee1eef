package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/sandbox"
	sbclient "github.com/sandboxd/sandboxd/sandbox/client"
)

// daemon is one `sandboxd serve` subprocess of this run.
type daemon struct {
	cmd    *exec.Cmd
	socket string
	c      *sbclient.Client
	done   chan struct{}
}

// startDaemon starts `sandboxd serve` with an ephemeral key (pinned from
// its identity: the bench trusts the daemon it started itself).
func (b *bench) startDaemon(ctx context.Context) (*daemon, error) {
	if b.d != nil {
		return b.d, nil
	}
	return b.startDaemonOn(ctx, "docker", b.o.name, &b.d)
}

// startCtrDaemon starts (once) the daemon on the containerd engine.
func (b *bench) startCtrDaemon(ctx context.Context) (*daemon, error) {
	if b.dc != nil {
		return b.dc, nil
	}
	return b.startDaemonOn(ctx, "containerd", b.ctrName(), &b.dc)
}

// startDaemonOn starts a daemon on engine; it is in *slot from its start,
// so that close stops it on every path.
func (b *bench) startDaemonOn(ctx context.Context, engine, name string, slot **daemon, extra ...string) (*daemon, error) {
	dir := filepath.Join(b.o.tmp, "daemon-"+name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	d := &daemon{socket: filepath.Join(dir, "sandboxd.sock"), done: make(chan struct{})}
	d.cmd = exec.Command(filepath.Join(b.o.bin, "sandboxd"), "serve",
		"--socket", d.socket, "--state", filepath.Join(dir, "state"), "--ephemeral-key",
		"--name", name, "--concurrency", "4", "--max-blob-bytes", strconv.Itoa(2<<30), "--engine", engine)
	if engine == "containerd" && b.o.runtime == sandbox.RuntimeRunsc {
		d.cmd.Args = append(d.cmd.Args, "--allow-runsc", "--runtime", sandbox.RuntimeRunsc)
	}
	d.cmd.Args = append(d.cmd.Args, extra...)
	logName := filepath.Join(b.o.tmp, "daemon-"+name+".log")
	logf, err := os.Create(logName)
	if err != nil {
		return nil, err
	}
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { d.cmd.Wait(); logf.Close(); close(d.done) }()
	*slot = d
	deadline := time.Now().Add(30 * time.Second)
	for {
		c := sbclient.New(d.socket, sandbox.KeySet{})
		id, err := c.Identity(ctx)
		c.Close()
		if err == nil {
			keys, err := sandbox.ParseKeySet([]byte(id.PublicKey))
			if err != nil {
				return nil, fmt.Errorf("daemon identity: %w", err)
			}
			d.c = sbclient.New(d.socket, keys)
			d.c.PollTimeout = time.Minute
			return d, nil
		}
		select {
		case <-d.done:
			log, _ := os.ReadFile(logName)
			return nil, fmt.Errorf("sandboxd serve exited: %s", lastLines(string(log), 5))
		default:
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("daemon did not answer within 30s: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop ends the daemon with SIGTERM, which drains running jobs.
func (d *daemon) stop() {
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(60 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
	}
}

// job submits a sealed job and waits for its verified result.
func (d *daemon) job(ctx context.Context, j sandbox.Job) (sandbox.Result, error) {
	if _, err := d.c.Submit(ctx, j); err != nil {
		return sandbox.Result{}, err
	}
	sr, err := d.c.Wait(ctx, j)
	return sr.Result, err
}

// succeeded turns a result that is not "succeeded" into an error.
func succeeded(res sandbox.Result, err error) error {
	if err != nil {
		return err
	}
	if res.Status != sandbox.StatusSucceeded {
		return fmt.Errorf("job %s: %s: %s", res.JobID, res.Status, res.Cause)
	}
	return nil
}

// rss reads the daemon's resident set and its high-water mark, in bytes.
func (d *daemon) rss() (cur, peak int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		return 0, 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		n, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			cur = n << 10
		case "VmHWM:":
			peak = n << 10
		}
	}
	if cur == 0 {
		return 0, 0, errors.New("no VmRSS in /proc status")
	}
	return cur, peak, nil
}

// sampleRSS records the daemon's largest VmRSS until stop is called.
func (d *daemon) sampleRSS() (stop func() int64) {
	var mu sync.Mutex
	var peak int64
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			if cur, _, err := d.rss(); err == nil {
				mu.Lock()
				peak = max(peak, cur)
				mu.Unlock()
			}
			select {
			case <-quit:
				return
			case <-t.C:
			}
		}
	}()
	return func() int64 {
		close(quit)
		wg.Wait()
		return peak
	}
}

// putBlobFile streams a file to the daemon's blob endpoint without
// holding it in memory (the client's PutBlob takes a byte slice).
func (d *daemon) putBlobFile(ctx context.Context, digest, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dd net.Dialer
		return dd.DialContext(ctx, "unix", d.socket)
	}}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://sandboxd/v1/blobs/"+digest, f)
	if err != nil {
		return err
	}
	req.ContentLength = st.Size()
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("put blob: %s", resp.Status)
	}
	return nil
}

// cpuTicks returns the machine's busy clock ticks (user, nice, system,
// irq, softirq, steal) from /proc/stat.
func cpuTicks() int64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0])
	var busy int64
	for i, v := range f[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		busy += n
	}
	return busy
}

// procTicks returns a process's user+system clock ticks.
func procTicks(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return u + st
}

// metrics reads the daemon's unlabelled series by name.
func (d *daemon) metrics(ctx context.Context) (map[string]float64, error) {
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dd net.Dialer
		return dd.DialContext(ctx, "unix", d.socket)
	}}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://sandboxd/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && !strings.HasPrefix(f[0], "#") {
			if v, err := strconv.ParseFloat(f[1], 64); err == nil {
				out[f[0]] = v
			}
		}
	}
	return out, sc.Err()
}

// settle waits until the daemon starts no pooled sandbox, so that its
// refills are not timed as part of the next sample, of either side.
func (d *daemon) settle(ctx context.Context) error {
	deadline := time.Now().Add(time.Minute)
	for {
		m, err := d.metrics(ctx)
		if err != nil {
			return err
		}
		if m["sandboxd_pool_starting"] == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("the daemon's pool did not settle within a minute")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
