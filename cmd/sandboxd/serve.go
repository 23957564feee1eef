package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/journal"
	"github.com/sandboxd/sandboxd/internal/receipt"
	"github.com/sandboxd/sandboxd/internal/server"
	"github.com/sandboxd/sandboxd/internal/supervisor"
	"github.com/sandboxd/sandboxd/sandbox/fleet"
)

// serveOptions are the flags of `sandboxd serve`.
type serveOptions struct {
	socket, listen               string
	tlsCert, tlsKey, tlsClientCA string
	state, key                   string
	ephemeralKey                 bool
	name, volumePrefix           string
	concurrency, queue, pool     int
	reapGrace, drainTimeout      time.Duration
	maxBlob, maxUpload           int64
	blobBudget, volumeBudget     int64
	allowRunsc                   bool
	runtime                      *runtimeFlag
	debug                        bool
	engine                       *engineOptions
	fleet                        fleetFlags
	fleetLease                   time.Duration
	fleetReplicas                int
	fleetAckWait                 time.Duration
	fleetBlobBytes               int64
	fleetBlobAge                 time.Duration
	fleetKeys                    verifyKeyFlags
	tenants                      string
	retain                       time.Duration
}

// faultEnv names the test-only fault injection: "STEP:JOBID" makes the
// daemon SIGKILL itself when job JOBID reaches STEP (accepted, created,
// started, the collection steps of broker.CollectSteps, exited). The daemon's crash tests use it; nothing else should.
const faultEnv = "SANDBOXD_TEST_FAULT"

// cmdServe runs the daemon until SIGTERM or SIGINT: then it stops taking
// jobs, waits --drain-timeout for running ones and exits; jobs still
// running are recovered by the next start (see internal/server). SIGHUP
// reads --tenants again.
func cmdServe(ctx context.Context, args []string, _, stderr io.Writer) int {
	o, fs := serveFlags(stderr)
	if code := parseFlags(fs, args); code >= 0 {
		return code
	}
	if code := o.checkUsage(fs, stderr); code >= 0 {
		return code
	}
	level := slog.LevelInfo
	if o.debug {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	if err := serve(ctx, *o, log); err != nil {
		log.Error("serve", "error", err)
		return exitInfraError
	}
	return exitOK
}

// serveFlags declares the flags of `sandboxd serve`.
func serveFlags(stderr io.Writer) (*serveOptions, *flag.FlagSet) {
	o := &serveOptions{}
	def := server.Default()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.socket, "socket", "/run/sandboxd/sandboxd.sock", "unix socket `PATH` (mode 0660); empty to listen on --listen only")
	fs.StringVar(&o.listen, "listen", "", "TCP `ADDR` to listen on with mutual TLS (needs --tls-cert, --tls-key, --tls-client-ca)")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "server certificate `FILE`")
	fs.StringVar(&o.tlsKey, "tls-key", "", "server key `FILE`")
	fs.StringVar(&o.tlsClientCA, "tls-client-ca", "", "CA `FILE` client certificates must chain to")
	fs.StringVar(&o.state, "state", "", "state `DIR`: journal, blobs, assessments (required)")
	fs.StringVar(&o.key, "key", "", "signing key `FILE` (password from SANDBOXD_KEY_PASSWORD)")
	fs.BoolVar(&o.ephemeralKey, "ephemeral-key", false, "sign with a key generated at start (every envelope says so)")
	fs.StringVar(&o.name, "name", brokerNameOr("sandboxd"), "broker `NAME` in labels and envelopes (default $SANDBOXD_BROKER_NAME if set)")
	fs.StringVar(&o.volumePrefix, "volume-prefix", "", "prefix of cache volume names (default: --name)")
	fs.IntVar(&o.concurrency, "concurrency", def.Concurrency, "jobs running at once")
	fs.IntVar(&o.queue, "queue", def.QueueSize, "accepted jobs that may wait for a slot before submissions get 429")
	fs.IntVar(&o.pool, "pool", 2, "sandboxes started ahead of jobs and kept ready, per container shape (at most 4) a job without read-only inputs used in the last 10 minutes; each serves one job (0: start every sandbox when its job arrives)")
	fs.DurationVar(&o.reapGrace, "reap-grace", def.ReapGrace, "age before an unknown labelled container is removed")
	fs.DurationVar(&o.drainTimeout, "drain-timeout", def.DrainTimeout, "how long SIGTERM waits for running jobs")
	fs.Int64Var(&o.maxBlob, "max-blob-bytes", def.MaxBlobBytes, "largest upload")
	fs.Int64Var(&o.maxUpload, "max-upload-bytes", def.MaxUploadBytes, "bytes of uploads no accepted job names yet, together (beyond it uploads get 507)")
	fs.Int64Var(&o.blobBudget, "blob-budget", def.BlobBudget, "bytes the blob store keeps; beyond it the least recently used blobs no queued or running job needs are removed")
	fs.Int64Var(&o.volumeBudget, "volume-budget", def.VolumeBudget, "bytes of read-only input and image tree volumes kept; beyond it the least recently used no queued or running job needs are removed")
	fs.BoolVar(&o.allowRunsc, "allow-runsc", false, "allow jobs that ask for the runsc runtime")
	o.runtime = addRuntimeFlag(fs, "runtime of the jobs POST /v1/plan prescribes: runc or runsc (needs --allow-runsc)")
	o.engine = addEngineFlags(fs)
	o.fleet.register(fs)
	fs.DurationVar(&o.fleetLease, "fleet-lease", 5*time.Minute, "with --fleet: how long past its last heartbeat (and past a job's deadline) this host's claims hold if it stops; then another host ends them uncertain")
	fs.DurationVar(&o.fleetAckWait, "fleet-ack-wait", 30*time.Second, "with --fleet: how long a job message stays with a host that sends no word before it is delivered again (every host of a fleet must give the same)")
	fs.Var(&o.fleetKeys, "fleet-key", "with --fleet: another host's public key `PEM` file (repeatable): results it signed are assessed here")
	fs.IntVar(&o.fleetReplicas, "fleet-replicas", 3, "with --fleet: replicas of the fleet's streams and buckets when this host creates them (1, 3 or 5)")
	fs.Int64Var(&o.fleetBlobBytes, "fleet-blob-bytes", fleet.DefaultBlobBytes, "with --fleet: bytes the fleet's blob store holds (JetStream reserves them on every server of its replicas when the store is made; with --tenants, shared equally by tenants with no max_blob_bytes, each share at least --max-blob-bytes); every host of a fleet must give the same")
	fs.DurationVar(&o.fleetBlobAge, "fleet-blob-age", fleet.DefaultBlobAge, "with --fleet: how long a blob is kept in the fleet (a job queued longer loses its inputs); every host of a fleet must give the same")
	fs.StringVar(&o.tenants, "tenants", "", "tenants `FILE` (JSON, schema "+server.TenantsSchema+"): socket peers (uid, gid) and client certificate subjects mapped to tenants, roles and quotas; each tenant sees only its own jobs and blobs; read again on SIGHUP. Without it, whoever reaches the socket or holds a certificate of the client CA may read, cancel and fetch every job and blob")
	fs.DurationVar(&o.retain, "retain", 0, "how long an ended job's journal record (its receipt and result envelopes) and a retained assessment are kept; then they are removed, and the blobs only such records named with the next collection (0: forever)")
	fs.BoolVar(&o.debug, "debug", false, "log every request")
	return o, fs
}

// checkUsage refuses what the flags cannot mean together (exitUsage).
func (o *serveOptions) checkUsage(fs *flag.FlagSet, stderr io.Writer) int {
	if o.state == "" || fs.NArg() != 0 || (o.socket == "" && o.listen == "") {
		fmt.Fprintln(stderr, "usage: sandboxd serve --state DIR (--key FILE | --ephemeral-key) [--socket PATH] [--listen ADDR --tls-cert F --tls-key F --tls-client-ca F]")
		return exitUsage
	}
	if o.runtime.runsc() && !o.allowRunsc {
		fmt.Fprintf(stderr, "sandboxd serve: --runtime %q is not runc, or runsc with --allow-runsc\n", *o.runtime)
		return exitUsage
	}
	if (o.key == "") == !o.ephemeralKey {
		fmt.Fprintln(stderr, "sandboxd serve: give exactly one of --key FILE and --ephemeral-key; the daemon does not sign with a key it was not given unless told to")
		return exitUsage
	}
	if o.fleet.set() && o.fleetBlobBytes < o.maxBlob {
		fmt.Fprintf(stderr, "sandboxd serve: --fleet-blob-bytes %d is under --max-blob-bytes %d: the fleet's blob store could not hold the largest upload\n", o.fleetBlobBytes, o.maxBlob)
		return exitUsage
	}
	if o.fleet.set() && o.fleetBlobAge < time.Hour {
		fmt.Fprintf(stderr, "sandboxd serve: --fleet-blob-age %v is under an hour: a queued job's inputs would be gone before a host took it\n", o.fleetBlobAge)
		return exitUsage
	}
	return -1
}

func serve(ctx context.Context, o serveOptions, log *slog.Logger) error {
	// Before anything is opened: a bad tenants file is the first error.
	tenants, err := o.loadTenants()
	if err != nil {
		return err
	}
	defer o.reloadTenantsOnHUP(tenants, log)()
	// One process per state directory: a second one says who holds it
	// instead of timing out on the journal.
	unlock, err := server.LockState(o.state)
	if err != nil {
		return err
	}
	defer unlock()
	signer, err := o.signer(log)
	if err != nil {
		return err
	}
	jr, err := journal.Open(filepath.Join(o.state, "journal.db"))
	if err != nil {
		return err
	}
	defer jr.Close()
	assessments, err := supervisor.NewDirStore(filepath.Join(o.state, "assessments"))
	if err != nil {
		return err
	}
	s, err := openSandboxes(ctx, o.engine, o.brokerConfig(log), o.state, false)
	if err != nil {
		return err
	}
	defer s.Close()
	cfg := o.serverConfig(s, jr, signer, assessments, log)
	cfg.Tenants = tenants
	if o.fleet.set() {
		co, err := o.joinFleet(ctx, &cfg, log)
		if err != nil {
			return err
		}
		defer co.Close()
	}
	srv, err := server.New(cfg)
	if err != nil {
		return err
	}
	lns, err := o.listeners()
	if err != nil {
		return err
	}
	if err := srv.Start(ctx); err != nil {
		closeAll(lns)
		return err
	}
	hs, errc := serveHTTP(srv, lns)
	log.Info("serving", "socket", o.socket, "listen", o.listen, "key_id", signer.KeyID(), "ephemeral_key", signer.Ephemeral(), "concurrency", cfg.Concurrency, "queue", cfg.QueueSize)
	return drain(ctx, o, srv, s.broker, hs, len(lns), errc, log)
}

// loadTenants reads --tenants (nil without it).
func (o serveOptions) loadTenants() (*server.Tenants, error) {
	if o.tenants == "" {
		return nil, nil
	}
	data, err := os.ReadFile(o.tenants)
	if err != nil {
		return nil, fmt.Errorf("--tenants: %w", err)
	}
	return server.ParseTenants(o.tenants, data)
}

// reloadTenantsOnHUP reads --tenants again at every SIGHUP until the
// returned func is called (it waits for the reader to stop). A file that
// does not decode keeps the tenants read before; jobs keep their owners.
func (o serveOptions) reloadTenantsOnHUP(tenants *server.Tenants, log *slog.Logger) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-hup:
				o.reloadTenants(tenants, log)
			}
		}
	})
	return func() {
		signal.Stop(hup)
		close(done)
		wg.Wait()
	}
}

func (o serveOptions) reloadTenants(tenants *server.Tenants, log *slog.Logger) {
	if tenants == nil {
		log.Warn("SIGHUP: no --tenants to read again; nothing changes")
		return
	}
	data, err := os.ReadFile(o.tenants)
	if err == nil {
		err = tenants.Reload(data)
	}
	if err != nil {
		log.Error("SIGHUP: tenants not reloaded; the tenants read before stay", "file", o.tenants, "error", err)
		return
	}
	log.Info("SIGHUP: tenants reloaded", "file", o.tenants)
}

// signer is the daemon's signing key, named --name: --key, or one made now.
func (o serveOptions) signer(log *slog.Logger) (*receipt.Signer, error) {
	var signer *receipt.Signer
	var err error
	if o.ephemeralKey {
		signer, err = receipt.NewEphemeralSigner()
		log.Warn("signing with an ephemeral key: envelopes prove nothing once this process is gone")
	} else {
		signer, err = receipt.LoadSigner(o.key, []byte(os.Getenv("SANDBOXD_KEY_PASSWORD")))
	}
	if err != nil {
		return nil, err
	}
	return signer.WithName(o.name), nil
}

// brokerConfig is the daemon's broker: its name and volumes, runsc,
// its pool of ready sandboxes.
func (o serveOptions) brokerConfig(log *slog.Logger) broker.Config {
	bcfg := broker.Default()
	bcfg.Name = o.name
	bcfg.VolumePrefix = o.volumePrefix
	if bcfg.VolumePrefix == "" {
		bcfg.VolumePrefix = o.name
	}
	bcfg.AllowRunsc = o.allowRunsc
	bcfg.PoolSize = o.pool
	bcfg.Logger = log
	return bcfg
}

// serverConfig is the daemon's configuration from the flags and what
// serve opened.
func (o serveOptions) serverConfig(s *sandboxes, jr *journal.Journal, signer *receipt.Signer, assessments *supervisor.DirStore, log *slog.Logger) server.Config {
	cfg := server.Default()
	cfg.Name, cfg.Version = o.name, version
	cfg.Blobs, cfg.Journal, cfg.Signer = s.blobs, jr, signer
	cfg.Supervisor = supervisor.New(assessments)
	cfg.Concurrency, cfg.QueueSize = o.concurrency, o.queue
	cfg.ReapGrace, cfg.DrainTimeout, cfg.MaxBlobBytes = o.reapGrace, o.drainTimeout, o.maxBlob
	cfg.MaxUploadBytes = o.maxUpload
	cfg.Retain = o.retain
	cfg.BlobBudget, cfg.VolumeBudget = o.blobBudget, o.volumeBudget
	cfg.Logger = log
	cfg.Preflight = s.broker.Preflight
	cfg.Runtime = string(*o.runtime)
	// No job runs on an image before the isolation selfcheck passed on it
	// (checked before a job is journaled dispatched, once per image and
	// runtime: server.Prechecker).
	cfg.Broker = s.gated()
	cfg.Fault = faultHook(log)
	return cfg
}

// faultHook is the test-only fault of $SANDBOXD_TEST_FAULT (faultEnv), or
// nil.
func faultHook(log *slog.Logger) func(step, jobID string) {
	f := os.Getenv(faultEnv)
	if f == "" {
		return nil
	}
	step, id, _ := strings.Cut(f, ":")
	return func(s, jobID string) {
		if s == step && jobID == id {
			log.Warn("test fault: killing the daemon", "step", s, "job_id", jobID)
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
	}
}

// joinFleet connects to the fleet of --fleet and sets cfg.Fleet. A fleet
// that does not answer within two minutes is an error naming it, not a
// daemon that serves without it.
func (o serveOptions) joinFleet(ctx context.Context, cfg *server.Config, log *slog.Logger) (*fleet.JetStream, error) {
	octx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if o.fleet.tenant != "" {
		return nil, errors.New("--fleet-tenant is a submitter's: a host takes the jobs of every tenant of --tenants")
	}
	opt := fleet.Options{Name: "sandboxd host " + o.name, Setup: true, Replicas: o.fleetReplicas, AckWait: o.fleetAckWait,
		BlobBytes: o.fleetBlobBytes, BlobAge: o.fleetBlobAge}
	if cfg.Tenants != nil {
		tenants := cfg.Tenants.List()
		for _, t := range tenants {
			if err := fleet.CheckTenantName(t.Name); err != nil {
				return nil, fmt.Errorf("--tenants %s with --fleet: tenant %q: %w", cfg.Tenants.File(), t.Name, err)
			}
			opt.Tenants = append(opt.Tenants, t.Name)
			if t.Quota.MaxBlobBytes > 0 {
				if opt.TenantBlobBytes == nil {
					opt.TenantBlobBytes = map[string]int64{}
				}
				opt.TenantBlobBytes[t.Name] = t.Quota.MaxBlobBytes
			} else if share := o.fleetBlobBytes / int64(len(tenants)); share < o.maxBlob {
				// The store JetStream makes for it (fleet.Options.TenantBlobBytes)
				// could not hold an upload this host takes.
				return nil, fmt.Errorf("--tenants %s with --fleet: tenant %q has no max_blob_bytes, so its blob store in the fleet is an equal share of --fleet-blob-bytes %d among %d tenants, %d bytes, under --max-blob-bytes %d: its largest upload could not be held there; give --fleet-blob-bytes more, the tenant a max_blob_bytes, or --max-blob-bytes less",
					cfg.Tenants.File(), t.Name, o.fleetBlobBytes, len(tenants), share, o.maxBlob)
			}
		}
	}
	co, err := o.fleet.openWith(octx, opt)
	if errors.Is(err, fleet.ErrNoRoom) {
		return nil, fmt.Errorf("%w (the blob store reserves --fleet-blob-bytes %d on each of --fleet-replicas servers: give less, or the servers more: max_file_store)", err, o.fleetBlobBytes)
	}
	if err != nil {
		return nil, err
	}
	fc := &server.FleetConfig{Coordinator: co, Lease: o.fleetLease, AckWait: o.fleetAckWait}
	for _, p := range o.fleetKeys {
		pem, err := os.ReadFile(p)
		if err != nil {
			co.Close()
			return nil, fmt.Errorf("--fleet-key: %w", err)
		}
		fc.Keys = append(fc.Keys, pem)
	}
	cfg.Fleet = fc
	log.Info("joined the fleet", "fleet", o.fleet.urls, "lease", o.fleetLease.String())
	return co, nil
}

// listeners listens on --socket and --listen.
func (o serveOptions) listeners() ([]net.Listener, error) {
	var lns []net.Listener
	if o.socket != "" {
		if err := os.MkdirAll(filepath.Dir(o.socket), 0o750); err != nil {
			return nil, err
		}
		ln, err := server.ListenUnix(o.socket)
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
	}
	if o.listen != "" {
		ln, err := server.ListenTLS(o.listen, o.tlsCert, o.tlsKey, o.tlsClientCA)
		if err != nil {
			closeAll(lns)
			return nil, err
		}
		lns = append(lns, ln)
	}
	return lns, nil
}

// serveHTTP serves the API on every listener; errc gets each one's end.
func serveHTTP(srv *server.Server, lns []net.Listener) (hs *http.Server, errc chan error) {
	// Long polls are bounded by the server's own wait limit; idle and slow
	// connections are not kept forever.
	hs = &http.Server{Handler: srv.Handler(), ConnContext: srv.ConnContext, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 5 * time.Minute, IdleTimeout: 2 * time.Minute}
	errc = make(chan error, len(lns))
	for _, ln := range lns {
		go func() { errc <- hs.Serve(ln) }()
	}
	return hs, errc
}

// drain waits for a signal (ctx) or a listener's failure, then stops taking
// jobs, waits --drain-timeout for running ones and stops serving HTTP.
func drain(ctx context.Context, o serveOptions, srv *server.Server, b *broker.Broker, hs *http.Server, listeners int, errc chan error, log *slog.Logger) error {
	var serveErr error
	select {
	case <-ctx.Done():
		log.Info("stopping: no new jobs; draining running ones", "drain_timeout", o.drainTimeout.String())
	case serveErr = <-errc:
	}
	// No sandbox is started ahead of a job any more, and the ready ones go.
	b.ClosePool()
	dctx, cancel := context.WithTimeout(context.Background(), o.drainTimeout)
	derr := srv.Shutdown(dctx)
	cancel()
	if derr != nil {
		log.Error("drain incomplete", "error", derr)
	}
	hctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	hs.Shutdown(hctx)
	cancel()
	for range listeners {
		if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) && serveErr == nil {
			serveErr = err
		}
	}
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return serveErr
	}
	// Not a clean stop: a supervisor (systemd) sees it, and the log says
	// which jobs the next start recovers.
	if derr != nil {
		return fmt.Errorf("drain incomplete: %w", derr)
	}
	return nil
}

func closeAll(lns []net.Listener) {
	for _, ln := range lns {
		ln.Close()
	}
}
