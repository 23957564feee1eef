package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/sandbox/fleet"
)

// fleetFlags are the flags that reach a fleet's NATS servers, in NATS's
// own forms.
type fleetFlags struct {
	urls                   string
	creds                  string
	tlsCA, tlsCert, tlsKey string
	callTimeout            time.Duration
}

func (f *fleetFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.urls, "fleet", "", "the fleet's NATS server `URL[,URL…]` (docs/fleet.md)")
	fs.StringVar(&f.creds, "fleet-creds", "", "NATS credentials `FILE` for the fleet")
	fs.StringVar(&f.tlsCA, "fleet-tls-ca", "", "CA `FILE` the fleet's NATS servers chain to")
	fs.StringVar(&f.tlsCert, "fleet-tls-cert", "", "client certificate `FILE` for the fleet's NATS servers")
	fs.StringVar(&f.tlsKey, "fleet-tls-key", "", "client key `FILE` for the fleet's NATS servers")
	fs.DurationVar(&f.callTimeout, "fleet-call-timeout", 5*time.Second, "bound of each call to the fleet")
}

func (f *fleetFlags) set() bool { return f.urls != "" }

func (f *fleetFlags) open(ctx context.Context, name string, setup bool, replicas int) (*fleet.JetStream, error) {
	return f.openWith(ctx, fleet.Options{Name: name, Setup: setup, Replicas: replicas})
}

// openWith connects with opt, its servers and credentials from the flags.
func (f *fleetFlags) openWith(ctx context.Context, opt fleet.Options) (*fleet.JetStream, error) {
	for u := range strings.SplitSeq(f.urls, ",") {
		if u = strings.TrimSpace(u); u != "" {
			opt.URLs = append(opt.URLs, u)
		}
	}
	opt.Creds, opt.TLSCA, opt.TLSCert, opt.TLSKey, opt.CallTimeout = f.creds, f.tlsCA, f.tlsCert, f.tlsKey, f.callTimeout
	return fleet.Open(ctx, opt)
}

// cmdFleet is `sandboxd fleet status`.
func cmdFleet(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "status" {
		fmt.Fprintln(stderr, "usage: sandboxd fleet status --fleet URL [--json]")
		return exitUsage
	}
	var ff fleetFlags
	fs := flag.NewFlagSet("fleet status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ff.register(fs)
	asJSON := fs.Bool("json", false, "print the status as one line of JSON")
	if code := parseFlags(fs, args[1:]); code >= 0 {
		return code
	}
	if !ff.set() || fs.NArg() != 0 {
		fmt.Fprintln(stderr, "usage: sandboxd fleet status --fleet URL [--json]")
		return exitUsage
	}
	co, err := ff.open(ctx, "sandboxd fleet status", false, 0)
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd fleet status:", err)
		return exitInfraError
	}
	defer co.Close()
	hosts, err := co.Hosts(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd fleet status:", err)
		return exitInfraError
	}
	st, err := co.Stats(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd fleet status:", err)
		return exitInfraError
	}
	now := time.Now()
	type hostView struct {
		fleet.Host
		Alive bool `json:"alive"`
	}
	var hv []hostView
	for _, h := range hosts {
		hv = append(hv, hostView{Host: h, Alive: now.Sub(h.At) < h.Lease})
	}
	if *asJSON {
		out := map[string]any{"hosts": hv, "queued": st.Queued, "delivered_unacked": st.Pending,
			"stream_leader": st.StreamLeader, "stream_replicas": st.Replicas}
		b, _ := json.Marshal(out)
		fmt.Fprintln(stdout, string(b))
		return exitOK
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tALIVE\tRUNNING/SLOTS\tLAST HEARTBEAT\tKEY ID\tVERSION")
	for _, h := range hv {
		fmt.Fprintf(tw, "%s\t%v\t%d/%d\t%s ago\t%s\t%s\n", h.Name, h.Alive, h.Running, h.Concurrency,
			now.Sub(h.At).Round(time.Second), h.KeyID, h.Version)
	}
	tw.Flush()
	fmt.Fprintf(stdout, "queue: %d waiting, %d with a host (not yet acknowledged)\n", st.Queued, st.Pending)
	fmt.Fprintf(stdout, "job stream: leader %s; replicas %s\n", orNone(st.StreamLeader), orNone(strings.Join(st.Replicas, ", ")))
	return exitOK
}

// fleetJobClient is what submit, wait and status use over a fleet.
func (o *clientOptions) fleetRunner(ctx context.Context) (*fleet.Runner, func(), error) {
	keys, err := o.keySet()
	if err != nil {
		return nil, nil, err
	}
	co, err := o.fleet.open(ctx, "sandboxd client", false, 0)
	if err != nil {
		return nil, nil, err
	}
	return fleet.NewRunner(co, keys), co.Close, nil
}

var _ sandbox.Runner = (*fleet.Runner)(nil)
