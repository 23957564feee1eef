package testharness

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// NATSCluster is nats-server processes (the build scripts/setup pins, at
// bin/nats/nats-server, or $SANDBOXD_NATS_SERVER) clustered on loopback,
// JetStream on, every write synced (sync_interval: always, as
// docs/fleet.md requires in production). Every process is killed when the
// test ends.
type NATSCluster struct {
	t     testing.TB
	bin   string
	dir   string
	Nodes []*NATSNode
}

// NATSNode is one server of a cluster.
type NATSNode struct {
	Name                        string
	ClientPort, RoutePort, HTTP int
	conf                        string
	cmd                         *exec.Cmd
	log                         string
}

// URL is the node's client URL.
func (n *NATSNode) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.ClientPort) }

// NATSServer finds the pinned nats-server binary: a skip where it is
// missing outside CI, a failure under CI=true.
func NATSServer(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("SANDBOXD_NATS_SERVER")
	if bin == "" {
		_, file, _, _ := runtime.Caller(0)
		bin = filepath.Join(filepath.Dir(filepath.Dir(filepath.Dir(file))), "bin", "nats", "nats-server")
	}
	if _, err := os.Stat(bin); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no nats-server at %s (scripts/setup builds it), and CI=true: failing", bin)
		}
		t.Skipf("no nats-server at %s: run scripts/setup", bin)
	}
	return bin
}

// freePorts returns n distinct loopback ports free now. Every listener is
// held until all are picked: closed one by one, the kernel may hand the
// same port out again (CI once gave a node's route port to another's
// monitoring server, and the cluster never formed).
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// StartNATS starts an n-node cluster (1 is a single server) and waits
// until every node answers /healthz with JetStream ready.
func StartNATS(t testing.TB, n int) *NATSCluster {
	t.Helper()
	return StartNATSWith(t, n, "")
}

// testStoreBytes is the file store each test server may reserve: the
// fleet reserves its blob stores (50 GiB by default) against it, and left
// to itself nats-server takes three quarters of the disk's free space, so a
// suite's fleet would start or not by how full the machine's disk is. The
// tests write a few megabytes.
const testStoreBytes = 1 << 40

// StartNATSWith is StartNATS with more server configuration (accounts and
// users, say) appended to every node's.
func StartNATSWith(t testing.TB, n int, extra string) *NATSCluster {
	t.Helper()
	return startNATS(t, n, testStoreBytes, extra)
}

// StartNATSStore is StartNATS with each server's file store bounded by
// storeBytes (max_file_store).
func StartNATSStore(t testing.TB, n int, storeBytes int64) *NATSCluster {
	t.Helper()
	return startNATS(t, n, storeBytes, "")
}

func startNATS(t testing.TB, n int, storeBytes int64, extra string) *NATSCluster {
	t.Helper()
	c := &NATSCluster{t: t, bin: NATSServer(t), dir: t.TempDir()}
	ports := freePorts(t, 3*n)
	for i := range n {
		c.Nodes = append(c.Nodes, &NATSNode{Name: fmt.Sprintf("n%d", i+1), ClientPort: ports[3*i], RoutePort: ports[3*i+1], HTTP: ports[3*i+2]})
	}
	for _, node := range c.Nodes {
		var routes []string
		for _, o := range c.Nodes {
			if o != node {
				routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", o.RoutePort))
			}
		}
		store := filepath.Join(c.dir, node.Name)
		conf := fmt.Sprintf(`server_name: %s
listen: 127.0.0.1:%d
http: 127.0.0.1:%d
max_payload: 2MB
jetstream { store_dir: %q, sync_interval: always, max_file_store: %d }
`, node.Name, node.ClientPort, node.HTTP, store, storeBytes)
		if n > 1 {
			conf += fmt.Sprintf("cluster { name: sandboxd-test, listen: 127.0.0.1:%d, routes: [%s] }\n", node.RoutePort, strings.Join(routes, ", "))
		}
		conf += extra
		node.conf = filepath.Join(c.dir, node.Name+".conf")
		node.log = filepath.Join(c.dir, node.Name+".log")
		if err := os.WriteFile(node.conf, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for i := range c.Nodes {
		c.Start(i)
	}
	t.Cleanup(func() {
		for _, node := range c.Nodes {
			if node.cmd != nil {
				node.cmd.Process.Signal(syscall.SIGCONT)
				node.cmd.Process.Kill()
				node.cmd.Wait()
				node.cmd = nil
			}
		}
		if t.Failed() {
			for _, node := range c.Nodes {
				if b, err := os.ReadFile(node.log); err == nil {
					lines := strings.Split(strings.TrimSpace(string(b)), "\n")
					t.Logf("nats %s, last lines:\n%s", node.Name, strings.Join(lines[max(0, len(lines)-15):], "\n"))
				}
			}
		}
	})
	for i := range c.Nodes {
		c.WaitHealthy(i, 30*time.Second)
	}
	return c
}

// URLs are every node's client URL.
func (c *NATSCluster) URLs() []string {
	var out []string
	for _, n := range c.Nodes {
		out = append(out, n.URL())
	}
	return out
}

// Start starts node i (again).
func (c *NATSCluster) Start(i int) {
	c.t.Helper()
	node := c.Nodes[i]
	logf, err := os.OpenFile(node.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		c.t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(c.bin, "-c", node.conf)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	node.cmd = cmd
}

// Kill SIGKILLs node i.
func (c *NATSCluster) Kill(i int) {
	node := c.Nodes[i]
	if node.cmd != nil {
		node.cmd.Process.Kill()
		node.cmd.Wait()
		node.cmd = nil
	}
}

// Stop and Cont SIGSTOP and SIGCONT node i: to its peers, a partition.
func (c *NATSCluster) Stop(i int) { c.Nodes[i].cmd.Process.Signal(syscall.SIGSTOP) }
func (c *NATSCluster) Cont(i int) { c.Nodes[i].cmd.Process.Signal(syscall.SIGCONT) }

// MetaLeader is the node that leads the cluster's JetStream metadata, as
// the first node that answers says ("" if none knows).
func (c *NATSCluster) MetaLeader() string {
	hc := http.Client{Timeout: time.Second}
	for _, n := range c.Nodes {
		resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/jsz", n.HTTP))
		if err != nil {
			continue
		}
		var jsz struct {
			Meta *struct {
				Leader string `json:"leader"`
			} `json:"meta_cluster"`
		}
		err = json.NewDecoder(resp.Body).Decode(&jsz)
		resp.Body.Close()
		if err == nil && jsz.Meta != nil && jsz.Meta.Leader != "" {
			return jsz.Meta.Leader
		}
	}
	return ""
}

// WaitHealthy waits until node i reports JetStream healthy.
func (c *NATSCluster) WaitHealthy(i int, within time.Duration) {
	c.t.Helper()
	url := fmt.Sprintf("http://127.0.0.1:%d/healthz", c.Nodes[i].HTTP)
	deadline := time.Now().Add(within)
	hc := http.Client{Timeout: time.Second}
	for {
		resp, err := hc.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("nats %s not healthy after %v: %v", c.Nodes[i].Name, within, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
