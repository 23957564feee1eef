package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sandboxd/sandboxd/internal/server"
	"github.com/sandboxd/sandboxd/sandbox"
	"github.com/sandboxd/sandboxd/sandbox/fleet"
)

// fleetFlags are the flags that reach a fleet's NATS servers, in NATS's
// own forms.
type fleetFlags struct {
	urls                   string
	creds                  string
	tlsCA, tlsCert, tlsKey string
	tenant                 string
	callTimeout            time.Duration
}

func (f *fleetFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.urls, "fleet", "", "the fleet's NATS server `URL[,URL…]` (docs/fleet.md)")
	fs.StringVar(&f.creds, "fleet-creds", "", "NATS credentials `FILE` for the fleet")
	fs.StringVar(&f.tlsCA, "fleet-tls-ca", "", "CA `FILE` the fleet's NATS servers chain to")
	fs.StringVar(&f.tlsCert, "fleet-tls-cert", "", "client certificate `FILE` for the fleet's NATS servers")
	fs.StringVar(&f.tlsKey, "fleet-tls-key", "", "client key `FILE` for the fleet's NATS servers")
	fs.StringVar(&f.tenant, "fleet-tenant", "", "the tenant `NAME` a submitter acts for in a fleet with tenants (its NATS user's permissions name it: docs/fleet.md)")
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
	if !opt.Setup {
		opt.Tenant = f.tenant
	}
	return fleet.Open(ctx, opt)
}

const fleetUsage = `usage: sandboxd fleet status --fleet URL [--json]
       sandboxd fleet permissions --tenants FILE [--host-user NAME] [--account NAME]`

// cmdFleet is `sandboxd fleet status|permissions`.
func cmdFleet(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "permissions" {
		return cmdFleetPermissions(args[1:], stdout, stderr)
	}
	if len(args) == 0 || args[0] != "status" {
		fmt.Fprintln(stderr, fleetUsage)
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
		fmt.Fprintln(stderr, fleetUsage)
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

// cmdFleetPermissions is `sandboxd fleet permissions`: the fleet's NATS
// account, written from a tenants file, one model for the daemon's API
// and the fleet. Each identity's nats_users get their tenant's
// permissions in its role (fleet.TenantPermissions; an admin reads every
// tenant's records and blobs); the hosts' user gets the whole account.
// Passwords are NATS configuration variables, read from the environment
// of nats-server: SANDBOXD_NATS_PASSWORD_<USER> (upper case, '-' as '_').
func cmdFleetPermissions(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fleet permissions", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("tenants", "", "the tenants `FILE` the hosts serve (--tenants of sandboxd serve)")
	host := fs.String("host-user", "host", "the NATS `NAME` the hosts connect as")
	account := fs.String("account", "FLEET", "the NATS account `NAME` of the fleet")
	if code := parseFlags(fs, args); code >= 0 {
		return code
	}
	if *file == "" || fs.NArg() != 0 {
		fmt.Fprintln(stderr, fleetUsage)
		return exitUsage
	}
	out, err := fleetAccount(*file, *host, *account)
	if err != nil {
		fmt.Fprintln(stderr, "sandboxd fleet permissions:", err)
		return exitForInput(err)
	}
	fmt.Fprint(stdout, out)
	return exitOK
}

// fleetAccount is the NATS configuration of the fleet's account for the
// tenants of file.
func fleetAccount(file, host, account string) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	ts, err := server.ParseTenants(file, data)
	if err != nil {
		return "", err
	}
	for name, what := range map[string]string{host: "--host-user", account: "--account"} {
		if err := server.CheckNATSName(name); err != nil {
			return "", fmt.Errorf("%s %w", what, err)
		}
	}
	tenants := ts.List()
	var names []string
	for _, t := range tenants {
		if err := fleet.CheckTenantName(t.Name); err != nil {
			return "", fmt.Errorf("tenants file %s: tenant %q: %w", file, t.Name, err)
		}
		names = append(names, t.Name)
	}
	vars := map[string]string{} // password variable → user
	password := func(user string) (string, error) {
		v := "SANDBOXD_NATS_PASSWORD_" + strings.ToUpper(strings.ReplaceAll(user, "-", "_"))
		if o, ok := vars[v]; ok {
			return "", fmt.Errorf("nats users %q and %q would share the password variable %s: %w", o, user, v, sandbox.ErrInvalid)
		}
		vars[v] = user
		return "$" + v, nil
	}
	quote := func(l []string) string {
		q := make([]string, len(l))
		for i, s := range l {
			q[i] = strconv.Quote(s)
		}
		return strings.Join(q, ",\n            ")
	}
	var b strings.Builder
	// The file's name is quoted: a name with a newline would otherwise
	// end the comment and write configuration.
	fmt.Fprintf(&b, "# The NATS account of a sandboxd fleet, written by `sandboxd fleet permissions` from %q.\n", file)
	fmt.Fprintf(&b, "# Each password is the environment variable named, in nats-server's environment.\n")
	fmt.Fprintf(&b, "accounts {\n  %s {\n    jetstream: enabled\n    users: [\n", account)
	pw, err := password(host)
	if err != nil {
		return "", err
	}
	fmt.Fprintf(&b, "      # the hosts: the whole account\n      { user: %q, password: %s }\n", host, pw)
	for _, t := range tenants {
		for _, id := range t.Identities {
			for _, u := range id.NATSUsers {
				if u == host {
					return "", fmt.Errorf("tenants file %s: nats user %q of tenant %q is the hosts' user: %w", file, u, t.Name, sandbox.ErrInvalid)
				}
				var p fleet.Permissions
				switch id.Role {
				case server.RoleReader:
					p = fleet.TenantPermissions(t.Name, false)
				case server.RoleSubmitter:
					p = fleet.TenantPermissions(t.Name, true)
				case server.RoleAdmin:
					p = fleet.TenantPermissions(t.Name, true, names...)
				}
				pw, err := password(u)
				if err != nil {
					return "", err
				}
				fmt.Fprintf(&b, "      # tenant %q, %s\n      { user: %q, password: %s, permissions: {\n", t.Name, id.Role, u, pw)
				fmt.Fprintf(&b, "          publish: { allow: [\n            %s\n          ] }\n", quote(p.Publish))
				fmt.Fprintf(&b, "          subscribe: { allow: [%s] }\n      } }\n", quote(p.Subscribe))
			}
		}
	}
	fmt.Fprintf(&b, "    ]\n  }\n}\n")
	return b.String(), nil
}
