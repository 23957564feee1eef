package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moby/moby/client"
	"github.com/rogpeppe/go-internal/testscript"

	"github.com/sandboxd/sandboxd/internal/broker"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/testharness"
)

// scriptEnv is what TestMain prepared for the scripts.
var scriptEnv []string

func TestMain(m *testing.M) {
	cmds := map[string]func() int{
		"sandboxd": func() int { return run(context.Background(), os.Args[1:], os.Stdout, os.Stderr) },
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
// that removes this run's cache volumes.
func setupScripts() (func() error, error) {
	ctx := context.Background()
	nop := func() error { return nil }
	eng, err := testharness.Connect(ctx)
	if errors.Is(err, testharness.ErrNoEngine) {
		scriptEnv = append(scriptEnv, "SANDBOXD_TEST_NO_ENGINE=1")
		return nop, nil
	}
	if err != nil {
		return nil, err
	}
	repo, _ := filepath.Abs("../..")
	tmp, err := os.MkdirTemp("", "sandboxd-script-")
	if err != nil {
		return nil, err
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
		b, err := image.Build(ctx, eng, filepath.Join(repo, "images", name), tmp, nil)
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
		f := make(client.Filters).Add("label", broker.LabelBroker+"="+name, broker.LabelJob)
		cs, err := eng.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
		if err != nil {
			return err
		}
		if len(cs.Items) > 0 {
			return fmt.Errorf("%d job containers left behind", len(cs.Items))
		}
		// daemon.txtar kills its daemon outright: the sandboxes it had
		// ready stay until a next start would reap them.
		pf := make(client.Filters).Add("label", broker.LabelBroker+"="+name, broker.LabelRole+"=pool")
		ps, err := eng.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: pf})
		if err != nil {
			return err
		}
		for _, c := range ps.Items {
			if _, err := eng.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true}); err != nil {
				return err
			}
		}
		return broker.RemoveCache(ctx, eng, name)
	}, nil
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
		Condition: func(cond string) (bool, error) {
			if cond == "engine" {
				return os.Getenv("SANDBOXD_TEST_NO_ENGINE") == "" && len(scriptEnv) > 1, nil
			}
			return false, fmt.Errorf("unknown condition %q", cond)
		},
	})
}
