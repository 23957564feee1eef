package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/sandbox/fleet"
)

// fleetItem is item 6: a fleet of daemons on one 3-node NATS cluster
// (R3, every write synced) on loopback. It measures a no-op job submitted
// through the fleet against the same job on one host's socket, and 60
// one-second jobs at concurrency 2 per host on 1 host, then on 3.
func (b *bench) fleetItem(ctx context.Context) error {
	fmt.Printf("item 6: a fleet on NATS JetStream (3 nats-server nodes, R3, sync_interval: always), daemons on %s\n", b.o.fleetEngine)
	if b.o.fleetEngine == "containerd" {
		if _, err := b.ctrEngine(ctx); err != nil { // for the cleanup
			return err
		}
	}
	urls, err := b.startNATS(3)
	if err != nil {
		return err
	}
	var keys [][]byte
	for i := range 3 {
		name := fmt.Sprintf("%s-fleet%d", b.o.name, i)
		b.fleetNames = append(b.fleetNames, name)
		var d *daemon
		if _, err := b.startDaemonOn(ctx, b.o.fleetEngine, name, &d, "--fleet", strings.Join(urls, ","), "--concurrency", "2"); err != nil {
			return err
		}
		b.fleet = append(b.fleet, d)
		id, err := d.c.Identity(ctx)
		if err != nil {
			return err
		}
		keys = append(keys, []byte(id.PublicKey))
		if i == 0 {
			// The throughput on one host first: the others join later.
			break
		}
	}
	ks, err := sandbox.ParseKeySet(keys...)
	if err != nil {
		return err
	}
	co, err := fleet.Open(ctx, fleet.Options{URLs: urls, Name: "bench"})
	if err != nil {
		return err
	}
	defer co.Close()
	r := fleet.NewRunner(co, ks)
	viaFleet := func(ctx context.Context, j sandbox.Job) error {
		if _, err := r.Submit(ctx, j); err != nil {
			return err
		}
		sr, err := r.Wait(ctx, j)
		return succeeded(sr.Result, err)
	}
	// No-op, one host in the fleet: the socket and the fleet interleaved.
	local := b.fleet[0]
	for range 2 { // warm-up
		if err := succeeded(local.job(ctx, b.noopJob(sandbox.RuntimeRunc))); err != nil {
			return err
		}
		if err := viaFleet(ctx, b.noopJob(sandbox.RuntimeRunc)); err != nil {
			return err
		}
	}
	// Each job waits for the pool to be ready again (its refill is a
	// container start, which would otherwise fall on whichever side comes
	// next).
	settle := func() { time.Sleep(time.Second) }
	// Each side's time is split at its receipt: the socket's submit
	// answers once the journal took the job; the fleet's once a host
	// claimed it, journaled it and put its receipt in the record.
	type split struct{ submit, total []time.Duration }
	var sock, fl split
	timed := func(s *split, submit func(sandbox.Job) error, wait func(sandbox.Job) error) error {
		settle()
		j := b.noopJob(sandbox.RuntimeRunc)
		t := time.Now()
		if err := submit(j); err != nil {
			return err
		}
		s.submit = append(s.submit, time.Since(t))
		if err := wait(j); err != nil {
			return err
		}
		s.total = append(s.total, time.Since(t))
		return nil
	}
	m0, err := local.metrics(ctx)
	if err != nil {
		return err
	}
	for range b.o.rounds {
		if err := timed(&sock, func(j sandbox.Job) error { _, err := local.c.Submit(ctx, j); return err },
			func(j sandbox.Job) error { sr, err := local.c.Wait(ctx, j); return succeeded(sr.Result, err) }); err != nil {
			return err
		}
		if err := timed(&fl, func(j sandbox.Job) error { _, err := r.Submit(ctx, j); return err },
			func(j sandbox.Job) error { sr, err := r.Wait(ctx, j); return succeeded(sr.Result, err) }); err != nil {
			return err
		}
	}
	ms, mf := median(sock.total), median(fl.total)
	fmt.Printf("  no-op job, submit to verified result: socket %s, fleet %s (median of %d): fleet overhead %+.1f ms\n",
		msText(ms), msText(mf), b.o.rounds, float64(mf-ms)/1e6)
	fmt.Printf("    to the receipt: socket %s, fleet %s; all rounds (ms): socket %s, fleet %s\n",
		msText(median(sock.submit)), msText(median(fl.submit)), sortedMS(sock.total), sortedMS(fl.total))
	if m1, err := local.metrics(ctx); err == nil {
		// Where the fleet's jobs spent their time on the host (its
		// sandboxd_fleet_phase_seconds, over these rounds).
		var parts []string
		for _, ph := range []string{"queued", "claim", "receipt", "publish"} {
			key := `sandboxd_fleet_phase_seconds_%s{phase="` + ph + `"}`
			n := m1[fmt.Sprintf(key, "count")] - m0[fmt.Sprintf(key, "count")]
			sum := m1[fmt.Sprintf(key, "sum")] - m0[fmt.Sprintf(key, "sum")]
			if n > 0 {
				parts = append(parts, fmt.Sprintf("%s %.1f", ph, sum/n*1e3))
				b.results["fleet_noop_phase_"+ph+"_ms"] = sum / n * 1e3
			}
		}
		fmt.Printf("    the host's phases of the fleet's jobs (mean ms, sandboxd_fleet_phase_seconds): %s\n", strings.Join(parts, ", "))
	}
	b.results["fleet_noop_socket_ms"] = float64(ms) / 1e6
	b.results["fleet_noop_fleet_ms"] = float64(mf) / 1e6
	b.results["fleet_noop_socket_receipt_ms"] = float64(median(sock.submit)) / 1e6
	b.results["fleet_noop_fleet_receipt_ms"] = float64(median(fl.submit)) / 1e6

	batch := func(n int) (time.Duration, error) {
		jobs := make([]sandbox.Job, n)
		for i := range jobs {
			jobs[i] = b.noopJob(sandbox.RuntimeRunc)
			jobs[i].Argv = []string{"/bin/sleep", "1"}
			jobs[i].Digest = ""
			if err := jobs[i].Seal(); err != nil {
				return 0, err
			}
		}
		t := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for _, j := range jobs {
			wg.Go(func() {
				if err := viaFleet(ctx, j); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			return 0, err
		}
		return time.Since(t), nil
	}
	one, err := batch(60)
	if err != nil {
		return err
	}
	for i := 1; i < 3; i++ {
		name := fmt.Sprintf("%s-fleet%d", b.o.name, i)
		b.fleetNames = append(b.fleetNames, name)
		var d *daemon
		if _, err := b.startDaemonOn(ctx, b.o.fleetEngine, name, &d, "--fleet", strings.Join(urls, ","), "--concurrency", "2"); err != nil {
			return err
		}
		b.fleet = append(b.fleet, d)
		id, err := d.c.Identity(ctx)
		if err != nil {
			return err
		}
		keys = append(keys, []byte(id.PublicKey))
	}
	if ks, err = sandbox.ParseKeySet(keys...); err != nil {
		return err
	}
	r = fleet.NewRunner(co, ks)
	three, err := batch(60)
	if err != nil {
		return err
	}
	fmt.Printf("  60 jobs of sleep 1, concurrency 2 per host: 1 host %s, 3 hosts %s: %.2fx\n",
		one.Round(10*time.Millisecond), three.Round(10*time.Millisecond), float64(one)/float64(three))
	b.results["fleet_60_one_host_s"] = one.Seconds()
	b.results["fleet_60_three_hosts_s"] = three.Seconds()
	return nil
}

func msText(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/1e6) }

// sortedMS is the samples sorted, in whole milliseconds.
func sortedMS(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	var out []string
	for _, d := range s {
		out = append(out, fmt.Sprintf("%.0f", float64(d)/1e6))
	}
	return strings.Join(out, " ")
}

// startNATS starts an n-node nats-server cluster (bin/nats/nats-server,
// which scripts/setup builds) on loopback; the processes end with the
// bench.
func (b *bench) startNATS(n int) ([]string, error) {
	bin := filepath.Join(b.o.bin, "nats", "nats-server")
	// Every port is held until all are picked: one closed at once could
	// be picked again for another node.
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	port := func() (int, error) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		held = append(held, l)
		return l.Addr().(*net.TCPAddr).Port, nil
	}
	type node struct{ client, route, mon int }
	nodes := make([]node, n)
	for i := range nodes {
		for _, p := range []*int{&nodes[i].client, &nodes[i].route, &nodes[i].mon} {
			var err error
			if *p, err = port(); err != nil {
				return nil, err
			}
		}
	}
	for _, l := range held {
		l.Close()
	}
	held = nil
	var urls []string
	for i, nd := range nodes {
		var routes []string
		for j, o := range nodes {
			if j != i {
				routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", o.route))
			}
		}
		dir := filepath.Join(b.o.tmp, fmt.Sprintf("nats%d", i))
		conf := fmt.Sprintf("server_name: n%d\nlisten: 127.0.0.1:%d\nhttp: 127.0.0.1:%d\njetstream { store_dir: %q, sync_interval: always, max_file_store: 1099511627776 }\ncluster { name: bench, listen: 127.0.0.1:%d, routes: [%s] }\n",
			i+1, nd.client, nd.mon, dir, nd.route, strings.Join(routes, ", "))
		cf := dir + ".conf"
		if err := os.WriteFile(cf, []byte(conf), 0o600); err != nil {
			return nil, err
		}
		cmd := exec.Command(bin, "-c", cf)
		logf, err := os.Create(dir + ".log")
		if err != nil {
			return nil, err
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			logf.Close()
			return nil, fmt.Errorf("nats-server (scripts/setup builds it at bin/nats): %w", err)
		}
		b.stops = append(b.stops, func() { cmd.Process.Kill(); cmd.Wait(); logf.Close() })
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", nd.client))
	}
	for i, nd := range nodes {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", nd.mon))
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) {
				out, _ := os.ReadFile(filepath.Join(b.o.tmp, fmt.Sprintf("nats%d.log", i)))
				return nil, fmt.Errorf("nats-server n%d not healthy after 30s; its log ends:\n%s", i+1, lastLines(string(out), 10))
			}
		}
	}
	return urls, nil
}
