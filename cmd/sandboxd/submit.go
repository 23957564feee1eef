package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/sandbox/client"
)

// clientOptions are the flags the daemon client commands share.
type clientOptions struct {
	socket string
	keys   verifyKeyFlags
	fleet  fleetFlags
	// daemon is a daemon's https://HOST:PORT (serve --listen), reached
	// with mutual TLS instead of the socket.
	daemon                 string
	tlsCA, tlsCert, tlsKey string
}

func (o *clientOptions) register(fs *flag.FlagSet, needKeys bool) {
	fs.StringVar(&o.socket, "socket", "/run/sandboxd/sandboxd.sock", "daemon unix socket `PATH`")
	fs.StringVar(&o.daemon, "daemon", "", "a daemon's `URL` https://HOST:PORT (serve --listen), over mutual TLS instead of --socket (needs --tls-ca, --tls-cert, --tls-key)")
	fs.StringVar(&o.tlsCA, "tls-ca", "", "with --daemon: CA `FILE` the daemon's certificate chains to")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "with --daemon: client certificate `FILE` (its subject is the tenant, with serve --tenants)")
	fs.StringVar(&o.tlsKey, "tls-key", "", "with --daemon: client key `FILE`")
	if needKeys {
		fs.Var(&o.keys, "key", "pinned broker public key `PEM` file (repeat for rotation; over a fleet, every host's)")
	}
	o.fleet.register(fs)
}

func (o *clientOptions) keySet() (sandbox.KeySet, error) {
	var pems [][]byte
	for _, p := range o.keys {
		b, err := os.ReadFile(p)
		if err != nil {
			return sandbox.KeySet{}, err
		}
		pems = append(pems, b)
	}
	if len(pems) == 0 {
		return sandbox.KeySet{}, nil
	}
	return sandbox.ParseKeySet(pems...)
}

func (o *clientOptions) client() (*client.Client, error) {
	keys, err := o.keySet()
	if err != nil {
		return nil, err
	}
	if o.daemon == "" {
		return client.New(o.socket, keys), nil
	}
	cfg, err := o.tlsConfig()
	if err != nil {
		return nil, err
	}
	return client.NewTLS(strings.TrimRight(o.daemon, "/"), cfg, keys), nil
}

// tlsConfig is the mutual TLS of --daemon: TLS 1.3, the daemon's
// certificate checked against --tls-ca, --tls-cert presented.
func (o *clientOptions) tlsConfig() (*tls.Config, error) {
	if !strings.HasPrefix(o.daemon, "https://") {
		return nil, fmt.Errorf("--daemon %q: want https://HOST:PORT: %w", o.daemon, sandbox.ErrInvalid)
	}
	if o.tlsCA == "" || o.tlsCert == "" || o.tlsKey == "" {
		return nil, fmt.Errorf("--daemon needs --tls-ca, --tls-cert and --tls-key (the daemon takes mutual TLS only): %w", sandbox.ErrInvalid)
	}
	caPEM, err := os.ReadFile(o.tlsCA)
	if err != nil {
		return nil, fmt.Errorf("--tls-ca: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("--tls-ca: no certificates in %s: %w", o.tlsCA, sandbox.ErrInvalid)
	}
	cert, err := tls.LoadX509KeyPair(o.tlsCert, o.tlsKey)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert, --tls-key: %w", err)
	}
	return &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}, nil
}

// jobClient is what submit, wait and status need of a daemon or a fleet.
type jobClient interface {
	PutBlob(ctx context.Context, digest string, content []byte) error
	Submit(ctx context.Context, job sandbox.Job) (sandbox.SignedReceipt, error)
	Wait(ctx context.Context, job sandbox.Job) (sandbox.SignedResult, error)
}

// jobClient opens the daemon's client, or the fleet's with --fleet.
func (o *clientOptions) jobClient(ctx context.Context) (jobClient, func(), error) {
	if o.fleet.set() {
		if o.daemon != "" {
			return nil, nil, fmt.Errorf("give one of --daemon and --fleet: %w", sandbox.ErrInvalid)
		}
		return o.fleetRunner(ctx)
	}
	c, err := o.client()
	if err != nil {
		return nil, nil, err
	}
	return c, c.Close, nil
}

func readJobFile(path string) (sandbox.Job, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return sandbox.Job{}, err
	}
	return sandbox.DecodeJob(b)
}

// exitFor maps a client error to the documented exit codes.
func exitFor(err error) int {
	switch {
	case errors.Is(err, sandbox.ErrUncertain):
		return exitInfraError
	case errors.Is(err, sandbox.ErrInvalid), errors.Is(err, sandbox.ErrConflict),
		errors.Is(err, sandbox.ErrImageRefused), errors.Is(err, sandbox.ErrNotFound):
		return exitBadInput
	}
	return exitInfraError
}

// cmdSubmit uploads the given blobs, submits a sealed job file and prints
// its verified receipt envelope. Submitting the same file again prints
// the same bytes.
func cmdSubmit(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var o clientOptions
	var blobs multiFlag
	fs := flag.NewFlagSet("submit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.register(fs, true)
	fs.Var(&blobs, "blob", "input blob `FILE` to upload first (repeatable)")
	if code := parseFlags(fs, args); code >= 0 {
		return code
	}
	if fs.NArg() != 1 || len(o.keys) == 0 {
		fmt.Fprintln(stderr, "usage: sandboxd submit (--socket PATH | --daemon URL --tls-ca F --tls-cert F --tls-key F | --fleet URL) --key PUB [--blob FILE]... JOBFILE")
		return exitUsage
	}
	job, err := readJobFile(fs.Arg(0))
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd submit:", err)
		return exitBadInput
	}
	c, closeClient, err := o.jobClient(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd submit:", err)
		return exitFor(err)
	}
	defer closeClient()
	for _, p := range blobs {
		b, err := os.ReadFile(p)
		if err == nil {
			err = c.PutBlob(ctx, sandbox.DigestBytes(b), b)
		}
		if err != nil {
			fmt.Fprintf(stderr, "sandboxd submit: blob %s: %v\n", p, err)
			return exitFor(err)
		}
	}
	rc, err := c.Submit(ctx, job)
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd submit:", err)
		return exitFor(err)
	}
	stdout.Write(rc.Envelope)
	fmt.Fprintln(stdout)
	return exitOK
}

// cmdWait waits for a submitted job and prints its verified result
// envelope: exit 0 if it succeeded, 1 if it ended otherwise, 4 if its
// outcome is uncertain.
func cmdWait(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var o clientOptions
	fs := flag.NewFlagSet("wait", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.register(fs, true)
	timeout := fs.Duration("timeout", 0, "give up after this long (0: wait as long as it takes)")
	asJSON := fs.Bool("json", false, "print the verified result as one line of JSON (docs/schema/result.json) instead of its envelope")
	if code := parseFlags(fs, args); code >= 0 {
		return code
	}
	if fs.NArg() != 1 || len(o.keys) == 0 {
		fmt.Fprintln(stderr, "usage: sandboxd wait (--socket PATH | --daemon URL --tls-ca F --tls-cert F --tls-key F | --fleet URL) --key PUB [--timeout D] [--json] JOBFILE")
		return exitUsage
	}
	job, err := readJobFile(fs.Arg(0))
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd wait:", err)
		return exitBadInput
	}
	c, closeClient, err := o.jobClient(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd wait:", err)
		return exitFor(err)
	}
	defer closeClient()
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	sr, err := c.Wait(ctx, job)
	if *asJSON {
		if err == nil {
			printJSON(stdout, stderr, sr.Result)
		}
	} else if sr.Envelope != nil {
		stdout.Write(sr.Envelope)
		fmt.Fprintln(stdout)
	}
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd wait:", err)
		return exitFor(err)
	}
	fmt.Fprintf(stderr, "job %s: %s (exit %d)\n", job.ID, sr.Result.Status, sr.Result.ExitCode)
	return exitForStatus(sr.Result.Status)
}

// cmdStatus prints the daemon's unverified view of a job.
func cmdStatus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var o clientOptions
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.register(fs, false)
	asJSON := fs.Bool("json", false, "print the job's view as one line of JSON (docs/schema/jobview.json)")
	if code := parseFlags(fs, args); code >= 0 {
		return code
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: sandboxd status (--socket PATH | --daemon URL --tls-ca F --tls-cert F --tls-key F | --fleet URL) [--json] JOBID")
		return exitUsage
	}
	if o.fleet.set() {
		return fleetJobStatus(ctx, &o, fs.Arg(0), *asJSON, stdout, stderr)
	}
	c, err := o.client()
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd status:", err)
		return exitBadInput
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := c.Status(ctx, fs.Arg(0))
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd status:", err)
		return exitFor(err)
	}
	if *asJSON {
		return printJSON(stdout, stderr, st)
	}
	out, _ := json.MarshalIndent(st, "", "  ")
	fmt.Fprintln(stdout, string(out))
	return exitOK
}

// fleetJobStatus prints the fleet's (unverified) record of a job.
func fleetJobStatus(ctx context.Context, o *clientOptions, id string, asJSON bool, stdout, stderr io.Writer) int {
	r, closeRunner, err := o.fleetRunner(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd status:", err)
		return exitFor(err)
	}
	defer closeRunner()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	rec, err := r.Status(ctx, id)
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd status:", err)
		return exitFor(err)
	}
	if asJSON {
		return printJSON(stdout, stderr, rec)
	}
	out, _ := json.MarshalIndent(rec, "", "  ")
	fmt.Fprintln(stdout, string(out))
	return exitOK
}
