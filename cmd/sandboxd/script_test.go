package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/client"
	"github.com/rogpeppe/go-internal/testscript"
	"github.com/rogpeppe/go-internal/txtar"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/testharness"
)

// scriptEnv is what TestMain prepared for the scripts; scriptEngine is the
// engine their sandboxd commands run sandboxes on (nil without one), named
// by scriptEngineName: "docker", or "containerd" when
// SANDBOXD_ENGINE=containerd.
var (
	scriptEnv        []string
	scriptEngine     broker.Engine
	scriptEngineName string
)

func TestMain(m *testing.M) {
	cmds := map[string]func() int{
		// As main runs it: SIGTERM and SIGINT cancel the command.
		"sandboxd": func() int {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return run(ctx, os.Args[1:], os.Stdout, os.Stderr)
		},
	}
	if filepath.Base(os.Args[0]) == "sandboxd" {
		// A script runs the command: no setup in this child.
		os.Exit(testscript.RunMain(m, cmds))
	}
	cleanup, err := setupScripts()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cmd/sandboxd tests:", err)
		os.Exit(1)
	}
	// RunMain exits itself, so the cleanup runs inside the Run it calls.
	os.Exit(testscript.RunMain(cleanupM{m, cleanup}, cmds))
}

// cleanupM runs the tests and then the cleanup, which fails the run if
// anything was left behind.
type cleanupM struct {
	m       *testing.M
	cleanup func() error
}

func (c cleanupM) Run() int {
	code := c.m.Run()
	if err := c.cleanup(); err != nil {
		fmt.Fprintln(os.Stderr, "cmd/sandboxd tests:", err)
		code = 1
	}
	return code
}

// setupScripts builds the helper, the probe and the images, renders the
// example bundle with this machine's Go image, and returns the cleanup
// that removes this run's sandboxes and cache volumes. Images are built
// by Docker on either engine; with SANDBOXD_ENGINE=containerd the scripts'
// sandboxd commands run on containerd (testharness.ConnectContainerd),
// which imports the images from Docker by ID.
func setupScripts() (func() error, error) {
	ctx := context.Background()
	nop := func() error { return nil }
	noEngine := func() (func() error, error) {
		scriptEnv = append(scriptEnv, "SANDBOXD_TEST_NO_ENGINE=1")
		return nop, nil
	}
	docker, err := testharness.Connect(ctx)
	if errors.Is(err, testharness.ErrNoEngine) {
		return noEngine()
	}
	if err != nil {
		return nil, err
	}
	repo, _ := filepath.Abs("../..")
	tmp, err := os.MkdirTemp("", "sandboxd-script-")
	if err != nil {
		return nil, err
	}
	ctr, err := testharness.ConnectContainerd(ctx, docker)
	if err != nil {
		os.RemoveAll(tmp)
		if errors.Is(err, testharness.ErrNoEngine) {
			return noEngine()
		}
		return nil, err
	}
	closeEngine := func() {}
	if ctr != nil {
		scriptEngine, scriptEngineName, closeEngine = ctr, "containerd", func() { ctr.Close() }
		// A script's environment is its own (testscript passes on little
		// of this process's): the engine and what it needs, by name.
		scriptEnv = append(scriptEnv,
			"SANDBOXD_ENGINE=containerd",
			"SANDBOXD_CONTAINERD_ADDRESS="+ctr.Address(),
		)
		for _, k := range []string{"SANDBOXD_CONTAINERD_STATE", "SANDBOXD_RUNSC"} {
			if v := os.Getenv(k); v != "" {
				scriptEnv = append(scriptEnv, k+"="+v)
			}
		}
	} else {
		scriptEngine, scriptEngineName = docker, "docker"
		scriptEnv = append(scriptEnv, "SANDBOXD_ENGINE=docker")
	}
	for _, b := range []struct{ pkg, out string }{{"./cmd/sandboxd-shim", "sandboxd-shim"}, {"./cmd/sandboxd-probe", "sandboxd-probe"}} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(tmp, b.out), b.pkg)
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("build %s: %w\n%s", b.pkg, err, out)
		}
	}
	ids := map[string]string{}
	for _, name := range []string{"minimal", "go", "python"} {
		b, err := image.Build(ctx, docker, filepath.Join(repo, "images", name), tmp, nil)
		if err != nil {
			return nil, fmt.Errorf("build image %s: %w", name, err)
		}
		ids[name] = b.ID
	}
	// The example bundles name their image by ID: render them with the
	// Go image just built.
	render := func(example, out string) error {
		if err := os.CopyFS(out, os.DirFS(filepath.Join(repo, "examples", example, "bundle"))); err != nil {
			return err
		}
		tmpl, err := os.ReadFile(filepath.Join(repo, "examples", example, "bundle.json.in"))
		if err != nil {
			return err
		}
		r := strings.NewReplacer("@GO_IMAGE@", ids["go"], "@PYTHON_IMAGE@", ids["python"])
		return os.WriteFile(filepath.Join(out, "bundle.json"), []byte(r.Replace(string(tmpl))), 0o644)
	}
	bundle, cliBundle := filepath.Join(tmp, "example-bundle"), filepath.Join(tmp, "example-cli-bundle")
	if err := render("go", bundle); err != nil {
		return nil, err
	}
	if err := render("go-cli", cliBundle); err != nil {
		return nil, err
	}
	pyBundle, pyBridgeBundle := filepath.Join(tmp, "example-python-bundle"), filepath.Join(tmp, "example-python-bridge-bundle")
	if err := render("python", pyBundle); err != nil {
		return nil, err
	}
	if err := render("python-bridge", pyBridgeBundle); err != nil {
		return nil, err
	}
	var r [4]byte
	rand.Read(r[:])
	name := "sandboxd-script-" + hex.EncodeToString(r[:])
	scriptEnv = append(scriptEnv,
		"SANDBOXD_SHIM="+filepath.Join(tmp, "sandboxd-shim"),
		"SANDBOXD_PROBE="+filepath.Join(tmp, "sandboxd-probe"),
		"SANDBOXD_STATE="+filepath.Join(tmp, "state"),
		"SANDBOXD_BROKER_NAME="+name,
		"GO_IMAGE="+ids["go"],
		"MINIMAL_IMAGE="+ids["minimal"],
		"EXAMPLE_BUNDLE="+bundle,
		"EXAMPLES="+filepath.Join(repo, "examples", "go"),
		"EXAMPLE_CLI_BUNDLE="+cliBundle,
		"EXAMPLES_CLI="+filepath.Join(repo, "examples", "go-cli"),
		"PYTHON_IMAGE="+ids["python"],
		"PYTHON_BUNDLE="+pyBundle,
		"PYTHON_BRIDGE_BUNDLE="+pyBridgeBundle,
		"PYTHON_CANDIDATES="+filepath.Join(repo, "examples", "python", "candidates"),
		"REPO="+repo,
	)
	return func() error {
		defer os.RemoveAll(tmp)
		defer closeEngine()
		return cleanBroker(ctx, scriptEngine, name)
	}, nil
}

// cleanBroker fails if a job container of the broker name is left, and
// removes its ready sandboxes and cache volumes, on either engine (on
// containerd, ContainerRemove deletes the task, the container and its
// name leases; VolumeRemove the volume's directory). It fails if anything
// of the name is left after that. The images and their shared root views
// stay, as Docker's built images do: other runs use them.
func cleanBroker(ctx context.Context, eng broker.Engine, name string) error {
	f := make(client.Filters).Add("label", broker.LabelBroker+"="+name, broker.LabelJob)
	cs, err := eng.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return err
	}
	if len(cs.Items) > 0 {
		return fmt.Errorf("%d job containers of broker %s left behind", len(cs.Items), name)
	}
	// daemon.txtar kills its daemon outright: what it had made (the
	// sandboxes it had ready, whatever it was creating when it died)
	// stays until a next start would reap it, or goes by itself as its
	// helper sees the daemon gone. Every container of the name goes,
	// whatever its role, and the volumes only once none is left (CI16: one
	// still going held the shim volume; CI17: one went between the list
	// and its removal).
	if err := removeContainers(ctx, eng, name); err != nil {
		return err
	}
	if err := broker.RemoveCache(ctx, eng, name); err != nil {
		return err
	}
	return leftovers(ctx, eng, name)
}

// removeContainers removes every container of the broker name and waits,
// up to a minute, until none is listed: one that goes by itself meanwhile
// is gone, not an error.
func removeContainers(ctx context.Context, eng broker.Engine, name string) error {
	f := make(client.Filters).Add("label", broker.LabelBroker+"="+name)
	for deadline := time.Now().Add(time.Minute); ; {
		cs, err := eng.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
		if err != nil {
			return err
		}
		if len(cs.Items) == 0 {
			return nil
		}
		for _, c := range cs.Items {
			if _, err := eng.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true}); err != nil && !errdefs.IsNotFound(err) && !errdefs.IsConflict(err) {
				return err
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d containers of broker %s still there after a minute of removals", len(cs.Items), name)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// leftovers fails if a container or volume of the broker name remains.
func leftovers(ctx context.Context, eng broker.Engine, name string) error {
	f := make(client.Filters).Add("label", broker.LabelBroker+"="+name)
	cs, err := eng.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return err
	}
	vs, err := eng.VolumeList(ctx, client.VolumeListOptions{Filters: f})
	if err != nil {
		return err
	}
	var left []string
	for _, c := range cs.Items {
		left = append(left, "container "+c.ID)
	}
	for _, v := range vs.Items {
		left = append(left, "volume "+v.Name)
	}
	if len(left) > 0 {
		return fmt.Errorf("broker %s left behind on %s: %s", name, scriptEngineName, strings.Join(left, ", "))
	}
	return nil
}

// ownBroker is the script command "own-broker": the rest of the script runs
// under a broker name of its own (in $SANDBOXD_BROKER_NAME), cleaned when
// the script ends. For a script that runs a daemon with its default flags:
// a daemon reaps the containers of its name that its journal does not know,
// which would be other scripts' under the shared name.
func ownBroker(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 0 {
		ts.Fatalf("usage: own-broker")
	}
	if scriptEngine == nil {
		ts.Fatalf("own-broker: no engine")
	}
	var r [4]byte
	rand.Read(r[:])
	name := ts.Getenv("SANDBOXD_BROKER_NAME") + "-" + hex.EncodeToString(r[:])
	ts.Setenv("SANDBOXD_BROKER_NAME", name)
	ts.Defer(func() {
		if err := cleanBroker(context.Background(), scriptEngine, name); err != nil {
			ts.Fatalf("own-broker: %v", err)
		}
	})
}

func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir: "testdata/script",
		Setup: func(e *testscript.Env) error {
			e.Vars = append(e.Vars, scriptEnv...)
			// HOME and the cache directory stay inside the script's work dir.
			e.Setenv("HOME", e.WorkDir)
			return nil
		},
		Cmds: map[string]func(*testscript.TestScript, bool, []string){"own-broker": ownBroker, "schema": cmdSchema},
		// [engine]: an engine answers; [engine:docker], [engine:containerd]:
		// it is that one (the engine the scripts' sandboxd commands run on).
		Condition: func(cond string) (bool, error) {
			switch cond {
			case "engine":
				return scriptEngine != nil, nil
			case "engine:docker", "engine:containerd":
				return cond == "engine:"+scriptEngineName, nil
			}
			return false, fmt.Errorf("unknown condition %q", cond)
		},
	})
}

// readmeUnscripted are the README's command blocks that readme.txtar does
// not run, each with the reason.
var readmeUnscripted = map[string]string{
	"./scripts/demo": "./scripts/test runs these tests and cannot run itself (CI runs exactly it: .ci/run); ./scripts/demo is run by hand",
}

// TestReadmeBlocksAreScripted: every ```sh block of README.md is, byte for
// byte, a .sh file of testdata/script/readme.txtar, which runs it with the
// engine; and every .sh file there is a README block. The README cannot
// drift from commands that run.
func TestReadmeBlocksAreScripted(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	ar, err := txtar.ParseFile("testdata/script/readme.txtar")
	if err != nil {
		t.Fatal(err)
	}
	scripts := map[string]string{} // content -> name
	for _, f := range ar.Files {
		if strings.HasSuffix(f.Name, ".sh") && f.Name != "sandboxd.sh" {
			scripts[string(f.Data)] = f.Name
		}
	}
	used := map[string]bool{}
	blocks := regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(readme), -1)
	if len(blocks) == 0 {
		t.Fatal("README.md has no ```sh block")
	}
blocks:
	for _, b := range blocks {
		for first, why := range readmeUnscripted {
			if strings.HasPrefix(b[1], first) {
				t.Logf("not run here: the block starting %q: %s", first, why)
				continue blocks
			}
		}
		name, ok := scripts[b[1]]
		if !ok {
			t.Errorf("README.md's block\n%s\nis not a .sh file of testdata/script/readme.txtar (copy it there, byte for byte, so that it runs)", b[1])
			continue
		}
		used[name] = true
	}
	for _, name := range scripts {
		if !used[name] {
			t.Errorf("readme.txtar's %s is no longer a block of README.md", name)
		}
	}
}
