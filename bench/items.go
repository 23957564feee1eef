package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/bundle"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/sandbox"
)

// noop is item 1: one no-op job end to end, against docker run.
func (b *bench) noop(ctx context.Context) error {
	fmt.Println("item 1: one no-op job end to end (docker run --rm --network none IMAGE /bin/true)")
	d, err := b.startDaemon(ctx)
	if err != nil {
		return err
	}
	if cur, _, err := d.rss(); err == nil {
		b.results["daemon_rss_fresh_bytes"] = cur
	}
	lib, tim, err := b.libraryBroker(filepath.Join(b.o.tmp, "lib-state"))
	if err != nil {
		return err
	}
	dc, err := b.startCtrDaemon(ctx)
	if err != nil {
		return err
	}
	clib, ctim, err := b.ctrLibraryBroker(ctx, filepath.Join(b.o.tmp, "lib-ctr-state"))
	if err != nil {
		return err
	}
	sides := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"docker run", b.dockerRun},
		{"sandboxd exec", b.sandboxdExec},
		{"sandboxd daemon", func(ctx context.Context) error { return succeeded(d.job(ctx, b.noopJob(sandbox.RuntimeRunc))) }},
		{"broker library", func(ctx context.Context) error { return succeeded(lib.Run(ctx, b.noopJob(sandbox.RuntimeRunc))) }},
		{"sandboxd exec (containerd)", b.sandboxdExecCtr},
		{"sandboxd daemon (containerd)", func(ctx context.Context) error { return succeeded(dc.job(ctx, b.noopJob(b.o.runtime))) }},
		{"broker library (containerd)", func(ctx context.Context) error { return succeeded(clib.Run(ctx, b.noopJob(b.o.runtime))) }},
	}
	// One warm-up of each: cache volumes, image layers, page cache.
	for _, s := range sides {
		if err := s.fn(ctx); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	tim.reset()
	ctim.reset()
	if b.o.profile != "" {
		// This process runs the broker library side and the daemon's
		// client (verification); the others are subprocesses.
		stop, err := startProfile(filepath.Join(b.o.profile, "item1-bench-process.cpu.pprof"))
		if err != nil {
			return err
		}
		defer stop()
	}
	m0, err := d.metrics(ctx)
	if err != nil {
		return err
	}
	samples := make([][]time.Duration, len(sides))
	for r := range b.o.rounds {
		// Rotate the order each round so no side always follows another.
		for k := range sides {
			i := (k + r) % len(sides)
			// The daemon refills its pool after each job: never while
			// another sample is timed.
			if err := d.settle(ctx); err != nil {
				return err
			}
			if err := dc.settle(ctx); err != nil {
				return err
			}
			dur, err := timed(func() error { return sides[i].fn(ctx) })
			if err != nil {
				return fmt.Errorf("%s: %w", sides[i].name, err)
			}
			samples[i] = append(samples[i], dur)
		}
	}
	base := median(samples[0])
	fmt.Printf("  %-34s %10s %8s\n", "", "median", "ratio")
	raw := map[string][]float64{}
	for i, s := range sides {
		m := median(samples[i])
		fmt.Printf("  %-34s %10s %8.2f\n", s.name, ms(m), float64(m)/float64(base))
		raw[s.name] = msList(samples[i])
	}
	fmt.Printf("  targets: exec ratio <= 1.0, daemon ratio <= 0.5; on containerd: exec <= 0.5, daemon (pooled) <= 0.1\n")
	if m1, err := d.metrics(ctx); err == nil {
		used := m1["sandboxd_pool_used_total"] - m0["sandboxd_pool_used_total"]
		fmt.Printf("  daemon jobs that ran in a pooled sandbox: %.0f of %d (sandboxd serve --pool, default 2)\n", used, b.o.rounds)
		b.results["item1_daemon_pooled"] = used
	}
	if m1, err := dc.metrics(ctx); err == nil {
		fmt.Printf("  containerd daemon jobs that ran in a pooled sandbox: %.0f of %d\n", m1["sandboxd_pool_used_total"], b.o.rounds+1)
	}
	fmt.Printf("  broker library, engine calls per job (median ms): %s\n", tim.summary(b.o.rounds))
	fmt.Printf("  broker library on containerd, engine calls per job (median ms): %s\n", ctim.summary(b.o.rounds))
	b.results["item1_ms"] = raw
	b.results["item1_engine_calls"] = tim.medians()
	b.results["item1_engine_calls_containerd"] = ctim.medians()
	return nil
}

// libraryBroker is the broker as `sandboxd run` and `sandboxd exec` use it,
// in this process, with every engine call timed.
func (b *bench) libraryBroker(state string) (*broker.Broker, *timingEngine, error) {
	eng, err := b.engine()
	if err != nil {
		return nil, nil, err
	}
	blobs, err := store.Open(filepath.Join(state, "blobs"))
	if err != nil {
		return nil, nil, err
	}
	cfg := broker.Default()
	cfg.Name, cfg.VolumePrefix = b.o.name, b.o.name
	cfg.ShimPath = filepath.Join(b.o.bin, "sandboxd-shim")
	tim := newTimingEngine(eng)
	br, err := broker.New(tim, blobs, cfg)
	return br, tim, err
}

// ctrLibraryBroker is libraryBroker on the containerd engine.
func (b *bench) ctrLibraryBroker(ctx context.Context, state string) (*broker.Broker, *timingEngine, error) {
	eng, err := b.ctrEngine(ctx)
	if err != nil {
		return nil, nil, err
	}
	blobs, err := store.Open(filepath.Join(state, "blobs"))
	if err != nil {
		return nil, nil, err
	}
	cfg := broker.Default()
	cfg.Name, cfg.VolumePrefix = b.ctrName(), b.ctrName()
	cfg.AllowRunsc = b.o.runtime == sandbox.RuntimeRunsc
	cfg.ShimPath = filepath.Join(b.o.bin, "sandboxd-shim")
	tim := newTimingEngine(eng)
	br, err := broker.New(tim, blobs, cfg)
	return br, tim, err
}

// throughput is item 2: 50 no-op jobs at concurrency 4.
func (b *bench) throughput(ctx context.Context) error {
	const jobs, conc = 50, 4
	fmt.Printf("item 2: %d no-op jobs at concurrency %d (xargs -P%d docker run)\n", jobs, conc, conc)
	d, err := b.startDaemon(ctx)
	if err != nil {
		return err
	}
	xargs := func(ctx context.Context) error {
		cmd := exec.CommandContext(ctx, "xargs", "-P"+strconv.Itoa(conc), "-n1", "-I{}",
			"docker", "run", "--rm", "--network", "none", b.o.image, "/bin/true")
		var in strings.Builder
		for i := range jobs {
			fmt.Fprintln(&in, i)
		}
		cmd.Stdin = strings.NewReader(in.String())
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("xargs: %w: %s", err, lastLines(string(out), 3))
		}
		return nil
	}
	dc, err := b.startCtrDaemon(ctx)
	if err != nil {
		return err
	}
	daemonOn := func(d *daemon, runtime string) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			js := make([]sandbox.Job, jobs)
			for i := range js {
				js[i] = b.noopJob(runtime)
			}
			// Submit everything (the queue holds it), then wait for each.
			errs := make(chan error, jobs)
			var wg sync.WaitGroup
			for _, j := range js {
				wg.Go(func() { errs <- succeeded(d.job(ctx, j)) })
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					return err
				}
			}
			return nil
		}
	}
	daemon, ctrDaemon := daemonOn(d, sandbox.RuntimeRunc), daemonOn(dc, b.o.runtime)
	var a, s, c []time.Duration
	// CPU seconds the whole machine and the daemon spent, per side: on two
	// cores, the engine's share says whether anything but the engine
	// could matter.
	var cpuA, cpuS, ownS, cpuC, ownC int64
	measure := func(total, own *int64, pid int, fn func(context.Context) error) func(context.Context) error {
		return func(ctx context.Context) error {
			t0, o0 := cpuTicks(), procTicks(pid)
			err := fn(ctx)
			*total += cpuTicks() - t0
			if own != nil {
				*own += procTicks(pid) - o0
			}
			return err
		}
	}
	xargs = measure(&cpuA, nil, 0, xargs)
	daemon = measure(&cpuS, &ownS, d.cmd.Process.Pid, daemon)
	ctrDaemon = measure(&cpuC, &ownC, dc.cmd.Process.Pid, ctrDaemon)
	m0, err := d.metrics(ctx)
	if err != nil {
		return err
	}
	sides := []struct {
		fn  func(context.Context) error
		out *[]time.Duration
	}{{xargs, &a}, {daemon, &s}, {ctrDaemon, &c}}
	for r := range b.o.batches {
		// Rotate the order each round so no side always follows another.
		for k := range sides {
			side := sides[(k+r)%len(sides)]
			if err := d.settle(ctx); err != nil {
				return err
			}
			if err := dc.settle(ctx); err != nil {
				return err
			}
			dur, err := timed(func() error { return side.fn(ctx) })
			if err != nil {
				return err
			}
			*side.out = append(*side.out, dur)
		}
	}
	ma, ms_, mc := median(a), median(s), median(c)
	fmt.Printf("  %-34s %10s %10s\n", "", "median", "jobs/s")
	fmt.Printf("  %-34s %10s %10.2f\n", "xargs -P4 docker run", ms(ma), jobs/ma.Seconds())
	fmt.Printf("  %-34s %10s %10.2f\n", "sandboxd daemon (concurrency 4)", ms(ms_), jobs/ms_.Seconds())
	fmt.Printf("  %-34s %10s %10.2f\n", "  on containerd", ms(mc), jobs/mc.Seconds())
	fmt.Printf("  throughput ratio sandboxd/docker: %.2f (target >= 1.25), on containerd %.2f (target >= 2)\n", ma.Seconds()/ms_.Seconds(), ma.Seconds()/mc.Seconds())
	perJob := func(t int64) float64 { return float64(t) / 100 / float64(jobs*b.o.batches) * 1000 } // USER_HZ = 100
	fmt.Printf("  CPU per job (all processes): docker %.0f ms, sandboxd %.0f ms (of which its daemon %.0f ms), on containerd %.0f ms (daemon %.0f ms)\n",
		perJob(cpuA), perJob(cpuS), perJob(ownS), perJob(cpuC), perJob(ownC))
	if m1, err := d.metrics(ctx); err == nil {
		fmt.Printf("  daemon jobs that ran in a pooled sandbox: %.0f of %d\n", m1["sandboxd_pool_used_total"]-m0["sandboxd_pool_used_total"], jobs*b.o.batches)
	}
	b.results["item2_ms"] = map[string][]float64{"xargs": msList(a), "daemon": msList(s), "daemon_containerd": msList(c)}
	return nil
}

// writeTree writes files random files of size bytes each, 100 per
// directory.
func writeTree(dir string, files, size int) error {
	rng := rand.NewChaCha8([32]byte{1})
	buf := make([]byte, size)
	for i := range files {
		sub := filepath.Join(dir, fmt.Sprintf("d%03d", i/100))
		if i%100 == 0 {
			if err := os.MkdirAll(sub, 0o755); err != nil {
				return err
			}
		}
		rng.Read(buf)
		if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%04d.bin", i)), buf, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// volumeContainer creates a volume and a container of the image that
// mounts it at /v and would run argv; remove removes both.
func (b *bench) volumeContainer(ctx context.Context, infix string, argv ...string) (id string, remove func(), err error) {
	vol := randID(b.o.name + infix)
	lab := "sandboxd.bench=" + b.o.name
	if err := sh(ctx, nil, "docker", "volume", "create", "--label", lab, vol); err != nil {
		return "", nil, err
	}
	args := append([]string{"create", "--label", lab, "--network", "none", "-v", vol + ":/v", b.o.image}, argv...)
	out, err := exec.CommandContext(ctx, "docker", args...).Output()
	if err != nil {
		sh(context.Background(), nil, "docker", "volume", "rm", "-f", vol)
		return "", nil, fmt.Errorf("docker create: %w", err)
	}
	id = strings.TrimSpace(string(out))
	return id, func() {
		sh(context.Background(), nil, "docker", "rm", "-f", id)
		sh(context.Background(), nil, "docker", "volume", "rm", "-f", vol)
	}, nil
}

// staging is item 3: a 100 MiB workspace of 5,000 files, ingested, copied
// in and collected back as 100 MiB of outputs.
func (b *bench) staging(ctx context.Context) error {
	const files, total = 5000, 100 << 20
	fmt.Println("item 3: 100 MiB workspace of 5,000 files: ingest + copy in + collect 100 MiB of outputs")
	ws := filepath.Join(b.o.tmp, "ws100")
	if err := writeTree(ws, files, total/files); err != nil {
		return err
	}
	defer os.RemoveAll(ws)
	lib, _, err := b.libraryBroker(filepath.Join(b.o.tmp, "stage-state"))
	if err != nil {
		return err
	}
	blobs, err := store.Open(filepath.Join(b.o.tmp, "stage-state", "blobs"))
	if err != nil {
		return err
	}
	limit := func(ctx context.Context) error {
		return sh(ctx, nil, "bash", "-c", "set -o pipefail; tar -cf - -C "+ws+" . | openssl dgst -sha256 >/dev/null")
	}
	var cpOnly []time.Duration
	dockerCp := func(ctx context.Context) error {
		id, remove, err := b.volumeContainer(ctx, "-cp-", "/bin/true")
		if err != nil {
			return err
		}
		defer remove()
		d, err := timed(func() error { return sh(ctx, nil, "docker", "cp", ws+"/.", id+":/v") })
		cpOnly = append(cpOnly, d)
		return err
	}
	// What a script around docker does for the same job, with none of
	// sandboxd's checks: create a container, docker cp the tree in, run
	// the same cp -r, docker cp the outputs out, remove it all.
	script := func(ctx context.Context) error {
		id, remove, err := b.volumeContainer(ctx, "-rt-", "/bin/cp", "-r", "/v/ws", "/v/out")
		if err != nil {
			return err
		}
		defer remove()
		back := filepath.Join(b.o.tmp, "rt-out")
		defer os.RemoveAll(back)
		for _, argv := range [][]string{
			{"docker", "cp", ws, id + ":/v/ws"},
			{"docker", "start", "-a", id},
			{"docker", "cp", id + ":/v/out", back},
		} {
			if err := sh(ctx, nil, argv[0], argv[1:]...); err != nil {
				return err
			}
		}
		return nil
	}
	var ingest, run []time.Duration
	docker, ctrd := map[string][]time.Duration{}, map[string][]time.Duration{}
	sandboxdOn := func(lib *broker.Broker, runtime string, ingest, run *[]time.Duration, phaseTimes map[string][]time.Duration) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			var sum bundle.Summary
			d, err := timed(func() error {
				var err error
				sum, err = bundle.Ingest(ctx, blobs, ws, bundle.Options{})
				return err
			})
			if err != nil {
				return fmt.Errorf("ingest: %w", err)
			}
			*ingest = append(*ingest, d)
			j := b.noopJob(runtime)
			j.Argv = []string{"/bin/cp", "-r", "/work/ws", "/tmp/out/"}
			j.Inputs = []sandbox.Input{{Name: "workspace", Digest: sum.Digest, Path: "/work/ws", Writable: true}}
			j.Outputs = []string{"/tmp/out"}
			j.Limits.DiskBytes = 256 << 20
			j.Limits.MemoryBytes = 1 << 30
			j.Limits.OutputBytes = 256 << 20
			j.Limits.FileCount = 10_000
			j.Limits.WallTimeMS = 120_000
			if err := j.Seal(); err != nil {
				return err
			}
			var res sandbox.Result
			ph := newPhases()
			d, err = timed(func() error {
				var err error
				res, err = lib.RunWithHooks(ctx, j, ph.hooks())
				return succeeded(res, err)
			})
			*run = append(*run, d)
			ph.add(phaseTimes)
			if err != nil {
				return err
			}
			var got int64
			for _, a := range res.Artifacts {
				got += a.Size
			}
			if len(res.Artifacts) != files || got != total/files*files {
				return fmt.Errorf("collected %d files / %d bytes, want %d / %d", len(res.Artifacts), got, files, total/files*files)
			}
			return nil
		}
	}
	clib, _, err := b.ctrLibraryBroker(ctx, filepath.Join(b.o.tmp, "stage-state")) // the same blob store: both stage what was ingested once
	if err != nil {
		return err
	}
	var ingestC, runC []time.Duration
	sandboxd, sandboxdCtr := sandboxdOn(lib, sandbox.RuntimeRunc, &ingest, &run, docker), sandboxdOn(clib, b.o.runtime, &ingestC, &runC, ctrd)
	if b.o.profile != "" {
		// The first sandboxd round runs under the CPU profiler.
		inner, profiled := sandboxd, false
		sandboxd = func(ctx context.Context) error {
			if profiled {
				return inner(ctx)
			}
			profiled = true
			stop, err := startProfile(filepath.Join(b.o.profile, "item3-sandboxd.cpu.pprof"))
			if err != nil {
				return err
			}
			defer stop()
			return inner(ctx)
		}
	}
	sides := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"tar -c | openssl dgst -sha256", limit},
		{"docker cp into a volume", dockerCp},
		{"docker: cp in, cp -r, cp out", script},
		{"sandboxd ingest+stage+collect", sandboxd},
		{"  on containerd", sandboxdCtr},
	}
	samples := make([][]time.Duration, len(sides))
	for r := range b.o.stage {
		for k := range sides {
			i := (k + r) % len(sides)
			dur, err := timed(func() error { return sides[i].fn(ctx) })
			if err != nil {
				return fmt.Errorf("%s: %w", sides[i].name, err)
			}
			samples[i] = append(samples[i], dur)
		}
	}
	mib := float64(total) / (1 << 20)
	thr := func(d time.Duration) float64 { return mib / d.Seconds() }
	fmt.Printf("  %-34s %10s %10s\n", "", "median", "MiB/s")
	for i, s := range sides {
		m := median(samples[i])
		fmt.Printf("  %-34s %10s %10.1f\n", s.name, ms(m), thr(m))
	}
	fmt.Printf("  %-34s %10s %10.1f\n", "  docker cp alone (no create/rm)", ms(median(cpOnly)), thr(median(cpOnly)))
	fmt.Printf("  %-34s %10s\n", "  sandboxd: ingest", ms(median(ingest)))
	fmt.Printf("  %-34s %10s\n", "  sandboxd: job (stage, cp, collect)", ms(median(run)))
	ms3 := median(samples[3])
	fmt.Printf("  sandboxd throughput vs docker cp: %.2fx (target >= 4), vs the limit: %.0f%% (target >= 50%%)\n",
		median(cpOnly).Seconds()/ms3.Seconds(), 100*median(samples[0]).Seconds()/ms3.Seconds())
	ms4 := median(samples[4])
	fmt.Printf("  on containerd: ingest %s, job %s; vs docker cp: %.2fx (target >= 4), vs the limit: %.0f%% (target >= 50%%)\n",
		ms(median(ingestC)), ms(median(runC)), median(cpOnly).Seconds()/ms4.Seconds(), 100*median(samples[0]).Seconds()/ms4.Seconds())
	fmt.Printf("  vs the docker script of the same job (no checks, nothing stored): %.2fx on Docker, %.2fx on containerd\n",
		median(samples[2]).Seconds()/ms3.Seconds(), median(samples[2]).Seconds()/ms4.Seconds())
	for _, e := range []struct {
		name string
		m    map[string][]time.Duration
	}{{"Docker", docker}, {"containerd", ctrd}} {
		fmt.Printf("  the job's phases on %s (medians):", e.name)
		for _, k := range phaseNames {
			fmt.Printf(" %s %s", k, ms(median(e.m[k])))
		}
		fmt.Println()
	}
	b.results["item3_ms"] = map[string][]float64{
		"limit": msList(samples[0]), "docker_cp_total": msList(samples[1]), "docker_cp": msList(cpOnly), "docker_script": msList(samples[2]),
		"sandboxd": msList(samples[3]), "sandboxd_ingest": msList(ingest), "sandboxd_job": msList(run),
		"sandboxd_containerd": msList(samples[4]), "sandboxd_containerd_ingest": msList(ingestC), "sandboxd_containerd_job": msList(runC),
	}
	return nil
}

// memory is item 4: the daemon's RSS idle and while it takes and stages a
// 1 GiB workspace.
func (b *bench) memory(ctx context.Context) error {
	const files, total = 64, 1 << 30
	fmt.Println("item 4: daemon RSS, idle and while staging a 1 GiB workspace")
	d, err := b.startDaemon(ctx)
	if err != nil {
		return err
	}
	ws := filepath.Join(b.o.tmp, "ws1g")
	if err := writeTree(ws, files, total/files); err != nil {
		return err
	}
	tarPath := filepath.Join(b.o.tmp, "ws1g.tar")
	f, err := os.Create(tarPath)
	if err != nil {
		return err
	}
	sum, err := bundle.WriteDir(ctx, ws, f, bundle.DefaultLimits())
	f.Close()
	os.RemoveAll(ws)
	defer os.Remove(tarPath)
	if err != nil {
		return fmt.Errorf("workspace tar: %w", err)
	}
	time.Sleep(2 * time.Second)
	idle, _, err := d.rss()
	if err != nil {
		return err
	}
	stop := d.sampleRSS()
	upload, err := timed(func() error { return d.putBlobFile(ctx, sum.Digest, tarPath) })
	if err != nil {
		stop()
		return fmt.Errorf("upload: %w", err)
	}
	j := b.noopJob(sandbox.RuntimeRunc)
	j.Inputs = []sandbox.Input{{Name: "workspace", Digest: sum.Digest, Path: "/work/ws", Writable: true}}
	j.Limits.DiskBytes = 1536 << 20
	j.Limits.MemoryBytes = 2 << 30
	j.Limits.WallTimeMS = 300_000
	if err := j.Seal(); err != nil {
		stop()
		return err
	}
	job, err := timed(func() error { return succeeded(d.job(ctx, j)) })
	peak := stop()
	if err != nil {
		return fmt.Errorf("1 GiB job: %w", err)
	}
	_, hwm, _ := d.rss()
	mib := func(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
	fmt.Printf("  idle RSS (fresh / after items 1-3): %s / %s\n", mib(asInt(b.results["daemon_rss_fresh_bytes"])), mib(idle))
	fmt.Printf("  peak RSS while uploading (%s) and staging (%s) 1 GiB: sampled %s, VmHWM %s (target <= 100 MiB)\n",
		ms(upload), ms(job), mib(peak), mib(hwm))
	b.results["item4"] = map[string]int64{"idle_bytes": idle, "peak_sampled_bytes": peak, "vmhwm_bytes": hwm,
		"upload_ms": upload.Milliseconds(), "job_ms": job.Milliseconds()}
	return nil
}

func asInt(v any) int64 {
	n, _ := v.(int64)
	return n
}

// envelopes is item 5: the Go benchmarks of signing and verifying.
func (b *bench) envelopes(ctx context.Context) error {
	fmt.Println("item 5: envelopes signed and verified per second (go test -bench)")
	cmd := exec.CommandContext(ctx, "go", "test", "-run", "^$", "-bench", ".", "-benchtime", "1s", "./internal/receipt", "./sandbox")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	rates := map[string]float64{}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 4 && strings.HasPrefix(f[0], "Benchmark") && f[3] == "ns/op" {
			ns, _ := strconv.ParseFloat(f[2], 64)
			name := strings.TrimPrefix(f[0], "Benchmark")
			if i := strings.LastIndex(name, "-"); i > 0 {
				name = name[:i]
			}
			rates[name] = 1e9 / ns
			fmt.Printf("  %-34s %10.0f /s  (%s ns/op)\n", name, 1e9/ns, f[2])
		}
	}
	io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("go test -bench: %w", err)
	}
	b.results["item5_per_second"] = rates
	return nil
}

// startProfile starts this process's CPU profile into path.
func startProfile(path string) (stop func(), err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// phaseNames are the parts of a job that phases measures, in order:
// until the container was created, until it started, staging the inputs,
// the command, collecting the outputs, and what is left (the result's
// checks, signature and the container's removal).
var phaseNames = []string{"create", "start", "stage", "command", "collect", "end"}

// phases times a job's parts from the broker's hooks.
type phases struct {
	mu                                              sync.Mutex
	begin, created, started, staged, ran, collected time.Time
}

func newPhases() *phases { return &phases{begin: time.Now()} }

func (p *phases) hooks() broker.Hooks {
	at := func(t *time.Time) {
		p.mu.Lock()
		*t = time.Now()
		p.mu.Unlock()
	}
	return broker.Hooks{
		OnCreated: func(context.Context, string) error { at(&p.created); return nil },
		OnStarted: func(string, time.Time) { at(&p.started) },
		OnProgress: func(phase string, _, _ int64) {
			switch phase {
			case "running":
				at(&p.staged)
			case "collecting":
				p.mu.Lock()
				if p.ran.IsZero() {
					p.ran = time.Now()
				}
				p.mu.Unlock()
			}
		},
		OnFinished: func(context.Context, sandbox.Result) error { at(&p.collected); return nil },
	}
}

// add appends the job's phases to m; call it when the job returned.
func (p *phases) add(m map[string][]time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	end := time.Now()
	marks := []time.Time{p.begin, p.created, p.started, p.staged, p.ran, p.collected, end}
	for i, k := range phaseNames {
		if !marks[i].IsZero() && !marks[i+1].IsZero() {
			m[k] = append(m[k], marks[i+1].Sub(marks[i]))
		}
	}
}
