package archtest

import (
	"bytes"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const (
	shimProtocol = "github.com/sandboxd/sandboxd/internal/shim"
	shimHelper   = "github.com/sandboxd/sandboxd/internal/shim/helper"
)

// goList runs go list with a template and returns its output lines.
func goListFields(t *testing.T, args ...string) []string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("go list %v: %v\n%s", args, err, errb.String())
	}
	return strings.Fields(out.String())
}

// The never edge "cmd/sandboxd ↛ internal/shim/helper" (never_test.go)
// means something only while the daemon speaks the protocol and the
// helper binary is the helper package.
func TestHelperSplitIsReal(t *testing.T) {
	if deps := goListFields(t, "-deps", "github.com/sandboxd/sandboxd/cmd/sandboxd"); !slices.Contains(deps, shimProtocol) {
		t.Errorf("cmd/sandboxd does not link %s; got deps %v", shimProtocol, deps)
	}
	if deps := goListFields(t, "-deps", "github.com/sandboxd/sandboxd/cmd/sandboxd-shim"); !slices.Contains(deps, shimHelper) {
		t.Errorf("cmd/sandboxd-shim does not link %s", shimHelper)
	}
}

// The protocol package only encodes and decodes: it can neither start a
// process nor open a file nor dial anything, itself or through anything it
// links. fmt links os and syscall, so those two are checked in the
// package's own imports; the rest in its transitive deps, which hold
// nothing outside the standard library.
func TestShimProtocolDoesNoIO(t *testing.T) {
	imports := goListFields(t, "-f", "{{join .Imports \" \"}}", shimProtocol)
	for _, forbidden := range []string{"os", "syscall"} {
		if slices.Contains(imports, forbidden) {
			t.Errorf("%s imports %s; got imports %v", shimProtocol, forbidden, imports)
		}
	}
	deps := goListFields(t, "-deps", "-f", "{{.ImportPath}}", shimProtocol)
	for _, forbidden := range []string{"os/exec", "net", "golang.org/x/sys/unix", shimHelper} {
		if slices.Contains(deps, forbidden) {
			t.Errorf("%s links %s; got deps %v", shimProtocol, forbidden, deps)
		}
	}
	nonStd := goListFields(t, "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", shimProtocol)
	if !slices.Equal(nonStd, []string{shimProtocol}) {
		t.Errorf("%s links packages outside the standard library: %v", shimProtocol, nonStd)
	}
}
