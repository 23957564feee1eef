package helper

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/shim"
)

func configFrame(t *testing.T, typ byte, v any) []byte {
	t.Helper()
	var p []byte
	switch v := v.(type) {
	case string:
		p = []byte(v)
	default:
		var err error
		if p, err = json.Marshal(v); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	if err := shim.WriteFrame(&buf, typ, p); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// needRoot skips a test that needs root when not root, but fails it under
// CI=true, where a skip would hide that the test never ran.
func needRoot(t *testing.T, why string) {
	t.Helper()
	if os.Getuid() == 0 {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("needs root %s, and CI is set: run the tests as root", why)
	}
	t.Skipf("needs root %s", why)
}

func TestReadConfig(t *testing.T) {
	good := shim.Config{Argv: []string{"true"}, UID: 65534, GID: 65534, CodeUID: 65533, CodeGID: 65533}
	with := func(f func(*shim.Config)) shim.Config { c := good; f(&c); return c }
	tests := []struct {
		name    string
		stream  []byte
		wantErr string // "" means accepted
	}{
		{"accepted", configFrame(t, shim.FrameConfig, good), ""},
		{"without a code uid", configFrame(t, shim.FrameConfig, with(func(c *shim.Config) { c.CodeUID, c.CodeGID = 0, 0 })), ""},
		{"empty stdin", nil, "read config"},
		{"truncated frame", configFrame(t, shim.FrameConfig, good)[:20], "read config"},
		{"not a config frame", configFrame(t, shim.FrameStatus, good), "want config"},
		{"not JSON", configFrame(t, shim.FrameConfig, "argv=true"), "decode config"},
		{"unknown field", configFrame(t, shim.FrameConfig, `{"argv":["true"],"uid":1,"gid":1,"privileged":true}`), "unknown field"},
		{"empty argv", configFrame(t, shim.FrameConfig, with(func(c *shim.Config) { c.Argv = nil })), "empty argv"},
		{"root candidate", configFrame(t, shim.FrameConfig, with(func(c *shim.Config) { c.UID = 0 })), "root candidate"},
		{"root group", configFrame(t, shim.FrameConfig, with(func(c *shim.Config) { c.GID = 0 })), "root candidate"},
		{"negative uid", configFrame(t, shim.FrameConfig, with(func(c *shim.Config) { c.UID = -1 })), "root candidate"},
		{"code uid is the candidate's", configFrame(t, shim.FrameConfig, with(func(c *shim.Config) { c.CodeUID = c.UID })), "code uid"},
		{"code gid root", configFrame(t, shim.FrameConfig, with(func(c *shim.Config) { c.CodeGID = 0 })), "code uid"},
		{"negative code uid", configFrame(t, shim.FrameConfig, with(func(c *shim.Config) { c.CodeUID = -1 })), "code uid"},
		{"negative code gid", configFrame(t, shim.FrameConfig, with(func(c *shim.Config) { c.CodeUID, c.CodeGID = 0, -1 })), "code uid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := readConfig(bytes.NewReader(tt.stream))
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("got error %v, want the config accepted", err)
			case tt.wantErr == "":
				if c.UID != good.UID || !reflect.DeepEqual(c.Argv, good.Argv) {
					t.Errorf("got config %+v, want %+v", c, good)
				}
			case err == nil:
				t.Fatalf("got config %+v, want an error naming %q", c, tt.wantErr)
			case !strings.Contains(err.Error(), tt.wantErr):
				t.Errorf("got error %q, want it to name %q", err, tt.wantErr)
			}
		})
	}
}

func TestLookPath(t *testing.T) {
	dir1, dir2 := t.TempDir(), t.TempDir()
	write := func(p string, mode os.FileMode) {
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(dir1, "plain"), 0o644) // not executable: skipped
	write(filepath.Join(dir2, "plain"), 0o755)
	write(filepath.Join(dir2, "tool"), 0o755)
	if err := os.Mkdir(filepath.Join(dir1, "tool"), 0o755); err != nil { // a directory: skipped
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir2, "tool"), filepath.Join(dir1, "linked")); err != nil {
		t.Fatal(err)
	}
	path := "PATH=" + dir1 + ":" + dir2
	tests := []struct {
		name, cmd string
		env       []string
		want      string // "" for sh in the default PATH
	}{
		{"first executable regular file", "tool", []string{path}, filepath.Join(dir2, "tool")},
		{"skips a non-executable file", "plain", []string{path}, filepath.Join(dir2, "plain")},
		{"a link to an executable counts", "linked", []string{path}, filepath.Join(dir1, "linked")},
		{"not found is left to the start to refuse", "missing", []string{path}, "missing"},
		{"the last PATH wins, as in the command's environment", "tool", []string{"PATH=/nonexistent", path}, filepath.Join(dir2, "tool")},
		{"default PATH without one", "sh", []string{"HOME=/"}, ""},
	}
	for _, tt := range tests {
		got := lookPath(tt.cmd, tt.env)
		if tt.want == "" {
			// /usr/local/bin, /usr/bin, /bin in that order; which one holds sh varies.
			if got != "/usr/local/bin/sh" && got != "/usr/bin/sh" && got != "/bin/sh" {
				t.Errorf("%s: got %q, want sh in the default PATH", tt.name, got)
			}
			continue
		}
		if got != tt.want {
			t.Errorf("%s: got %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestCommandResolvesOnlyBareNames(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "prog"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		argv0, want string
	}{
		{"prog", filepath.Join(dir, "prog")},
		{"./prog", "./prog"}, // relative to the workdir, never searched
		{"/bin/prog", "/bin/prog"},
	}
	for _, tt := range tests {
		cfg := &shim.Config{Argv: []string{tt.argv0, "x"}, Env: []string{"PATH=" + dir}, WorkDir: "/work", UID: 65534, GID: 65534}
		cmd, err := command(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if cmd.Path != tt.want {
			t.Errorf("argv0 %q: got path %q, want %q", tt.argv0, cmd.Path, tt.want)
		}
		cred := cmd.SysProcAttr.Credential
		if cred == nil || cred.Uid != 65534 || cred.Gid != 65534 || len(cred.Groups) != 0 {
			t.Errorf("argv0 %q: got credential %+v, want uid/gid 65534 and no groups", tt.argv0, cred)
		}
		if !cmd.SysProcAttr.Setsid || cmd.SysProcAttr.Pdeathsig != syscall.SIGKILL {
			t.Errorf("argv0 %q: got setsid %v, pdeathsig %v, want a new session killed with the helper", tt.argv0, cmd.SysProcAttr.Setsid, cmd.SysProcAttr.Pdeathsig)
		}
		if !reflect.DeepEqual(cmd.Env, cfg.Env) || cmd.Dir != "/work" {
			t.Errorf("argv0 %q: got env %v dir %q, want exactly the config's", tt.argv0, cmd.Env, cmd.Dir)
		}
	}
}

func TestExitStatus(t *testing.T) {
	tests := []struct {
		script   string
		wantCode int
		wantSig  string
	}{
		{"exit 0", 0, ""},
		{"exit 3", 3, ""},
		{"kill -KILL $$", 137, "SIGKILL"},
		{"kill -XFSZ $$", 128 + int(syscall.SIGXFSZ), "SIGXFSZ"},
		{"kill -TERM $$", 143, "SIGTERM"},
	}
	for _, tt := range tests {
		cmd := exec.Command("/bin/sh", "-c", tt.script)
		err := cmd.Run()
		code, sig := exitStatus(cmd.ProcessState, err)
		if code != tt.wantCode || sig != tt.wantSig {
			t.Errorf("%q: got %d %q, want %d %q", tt.script, code, sig, tt.wantCode, tt.wantSig)
		}
	}
	// A command that never started has no process state: 127, like a shell.
	if code, sig := exitStatus(nil, exec.ErrNotFound); code != 127 || sig != "" {
		t.Errorf("not started: got %d %q, want 127 \"\"", code, sig)
	}
}

func TestKillTargets(t *testing.T) {
	tests := []struct {
		name     string
		cfg      shim.Config
		codeUsed bool
		want     [][2]int
	}{
		{"candidate only", shim.Config{UID: 65534, GID: 65534}, false, [][2]int{{65534, 65534}}},
		{"code uid configured, never used", shim.Config{UID: 65534, GID: 65534, CodeUID: 65533, CodeGID: 65533}, false, [][2]int{{65534, 65534}}},
		{"code uid used", shim.Config{UID: 65534, GID: 65534, CodeUID: 65533, CodeGID: 65533}, true, [][2]int{{65534, 65534}, {65533, 65533}}},
		{"used without a code uid", shim.Config{UID: 65534, GID: 65534}, true, [][2]int{{65534, 65534}}},
	}
	for _, tt := range tests {
		if got := killTargets(&tt.cfg, tt.codeUsed); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
	}
}

// anyAlive decides whether the kill is done: a live process of the uid
// means no, a zombie (dead, not yet reaped) means yes.
func TestAnyAlive(t *testing.T) {
	needRoot(t, "to start processes as another uid")
	// uids no one on this host uses: the test must not see others' processes.
	const live, zombie, none = 3999917, 3999918, 3999919
	start := func(uid uint32) *exec.Cmd {
		cmd := exec.Command("/bin/sleep", "600")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	running := start(live)
	t.Cleanup(func() { running.Process.Kill(); running.Wait() })
	dead := start(zombie)
	if err := dead.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// Not reaped until the end: it stays a zombie while anyAlive looks.
	t.Cleanup(func() { dead.Wait() })
	waitZombie(t, dead.Process.Pid)

	tests := []struct {
		name string
		uid  int
		want bool
	}{
		{"a running process", live, true},
		{"only a zombie", zombie, false},
		{"no process", none, false},
	}
	for _, tt := range tests {
		if got := anyAlive(tt.uid); got != tt.want {
			t.Errorf("%s (uid %d): got %v, want %v", tt.name, tt.uid, got, tt.want)
		}
	}
}

// waitZombie waits until pid is a zombie (the kill is asynchronous).
func waitZombie(t *testing.T, pid int) {
	t.Helper()
	for {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil {
			t.Fatal(err)
		}
		if f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:])); len(f) > 0 && f[0] == "Z" {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

func TestAllDirs(t *testing.T) {
	root := t.TempDir()
	mk := func(p string) string {
		if err := os.MkdirAll(filepath.Join(root, p), 0o755); err != nil {
			t.Fatal(err)
		}
		return filepath.Join(root, p)
	}
	a, ab := mk("a"), mk("a/b")
	if err := os.WriteFile(filepath.Join(root, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(a, filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		paths []string
		want  bool
	}{
		{"none", nil, true},
		{"existing directories", []string{a, ab}, true},
		{"missing", []string{a, filepath.Join(root, "c")}, false},
		{"a regular file", []string{filepath.Join(root, "file")}, false},
		{"a link to a directory", []string{filepath.Join(root, "link")}, false},
		{"below a link", []string{filepath.Join(root, "link", "b")}, false},
	}
	for _, tt := range tests {
		if got := allDirs(tt.paths); got != tt.want {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestNothingToCollect: the helper writes the collection's summary itself
// only where the collector, as the candidate's uid, would find no entry
// at all; and then that summary is the collector's, byte for byte, and
// the one the protocol expects.
func TestNothingToCollect(t *testing.T) {
	needRoot(t, "to look as the candidate's uid and to give a directory to it")
	const uid = 65534
	root := sharedTempDir(t)
	dir := func(p string) string {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	work, tmp := dir("empty/work"), dir("empty/tmp")
	withFile := dir("file/work")
	if err := os.WriteFile(filepath.Join(withFile, ".hidden"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	withDir := dir("dir/work")
	dir("dir/work/out")
	// The candidate's own directory, which it made unreadable to itself:
	// root (the "others" class here) could list it, the collector could
	// not (it would reject the output directory).
	closed := dir("closed/work")
	if err := os.Chown(closed, uid, uid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(closed, 0o055); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(work, filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "empty"), filepath.Join(root, "linkabove")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name             string
		scratch, outputs []string
		want             bool
	}{
		{"empty scratch, outputs in it", []string{work, tmp}, []string{work + "/out", tmp}, true},
		{"empty scratch, no outputs", []string{work, tmp}, nil, true},
		{"no scratch, no outputs", nil, nil, true},
		{"a file in the scratch space", []string{tmp, withFile}, nil, false},
		{"an empty directory in the scratch space", []string{withDir}, []string{withDir + "/out"}, false},
		{"a scratch directory the candidate cannot list", []string{closed}, []string{closed + "/out"}, false},
		{"an output outside the scratch space", []string{work}, []string{tmp}, false},
		{"an output beside a scratch directory, sharing its prefix", []string{work}, []string{work + "2"}, false},
		{"an output above a scratch directory", []string{work}, []string{filepath.Dir(work)}, false},
		{"a scratch directory through a link", []string{filepath.Join(root, "link")}, nil, false},
		{"a link above a scratch directory", []string{filepath.Join(root, "linkabove", "work")}, nil, false},
		{"a missing scratch directory", []string{filepath.Join(root, "missing")}, nil, false},
		{"a relative scratch directory", []string{"."}, nil, false},
	}
	wantFrame := frameBytes(t, shim.FrameCollected, []byte(`{"files":0,"bytes":0,"limits_hit":[]}`))
	for _, tt := range tests {
		cfg := &shim.Config{UID: uid, GID: uid, Scratch: tt.scratch, Outputs: tt.outputs, OutputBytes: 1 << 20, FileCount: 10, FileSize: 1 << 20}
		if got := nothingToCollect(cfg); got != tt.want {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
		if !tt.want {
			continue
		}
		var fromHelper, fromCollector bytes.Buffer
		if err := (&out{w: &fromHelper}).json(shim.FrameCollected, emptyCollection()); err != nil {
			t.Fatal(err)
		}
		if code := collectFrames(&fromCollector, cfg); code != 0 {
			t.Fatalf("%s: collectFrames exited %d", tt.name, code)
		}
		if !bytes.Equal(fromHelper.Bytes(), wantFrame) || !bytes.Equal(fromCollector.Bytes(), wantFrame) {
			t.Errorf("%s: the helper's summary %q, the collector's %q, want %q", tt.name, fromHelper.Bytes(), fromCollector.Bytes(), wantFrame)
		}
	}
	if os.Geteuid() != 0 {
		t.Error("the thread that looked did not become root again")
	}
}

// sharedTempDir is a temporary directory, by its real path, that other
// uids may enter.
func sharedTempDir(t *testing.T) string {
	t.Helper()
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{filepath.Dir(root), root} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// frameBytes is one frame as the helper writes it.
func frameBytes(t *testing.T, typ byte, p []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := (&out{w: &b}).frame(typ, p); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestAcceptableName(t *testing.T) {
	tests := []struct {
		name      string
		want      bool
		sanitized string
	}{
		{"report.json", true, "report.json"},
		{"café ü", true, "café ü"},
		{"a\nb", false, "a?b"},
		{"tab\there", false, "tab?here"},
		{"del\x7f", false, "del?"},
		{"c1\u0085", false, "c1?"},
		{"bad\xffutf8", false, "bad?utf8"},
		{"\x1b[31mred", false, "?[31mred"},
	}
	for _, tt := range tests {
		if got := acceptableName(tt.name); got != tt.want {
			t.Errorf("acceptableName(%q): got %v, want %v", tt.name, got, tt.want)
		}
		if got := sanitizeName(tt.name); got != tt.sanitized {
			t.Errorf("sanitizeName(%q): got %q, want %q", tt.name, got, tt.sanitized)
		}
	}
}

// The kill returns once the killed processes are reaped, not only dead: a
// zombie holds its place in the pids cgroup, and the collector forked
// while a bomb's zombies filled it failed (EAGAIN).
func TestKillCandidatesWaitsForTheReap(t *testing.T) {
	needRoot(t, "to start a process as another uid")
	const uid = 3999920 // no one on this host uses it
	cmd := exec.Command("/bin/sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The test is the parent, and so the reaper: it reaps only once the
	// kill made a zombie and a while has gone by.
	reaped := make(chan struct{})
	go func() {
		defer close(reaped)
		waitZombie(t, cmd.Process.Pid)
		time.Sleep(300 * time.Millisecond)
		cmd.Wait()
	}()
	t.Cleanup(func() { cmd.Process.Kill(); <-reaped })
	if !killCandidates(&shim.Config{UID: uid, GID: uid}, false) {
		t.Fatal("killCandidates reported a survivor")
	}
	if anyLeft(uid) {
		t.Fatal("killCandidates returned while the killed process was not yet reaped (a zombie in the pids cgroup)")
	}
}

// Scratch space writable by other uids without the sticky bit is refused
// before anything of the job runs (an image's 0777 /work gave its tmpfs
// that mode); /tmp's 1777 and /work's 0755 are not.
func TestCheckScratch(t *testing.T) {
	for _, tt := range []struct {
		mode os.FileMode
		ok   bool
	}{
		{0o755, true},
		{0o700, true},
		{0o777 | os.ModeSticky, true},
		{0o777, false},
		{0o775, false},
		{0o757, false},
	} {
		d := t.TempDir()
		if err := os.Chmod(d, tt.mode); err != nil {
			t.Fatal(err)
		}
		err := checkScratch([]string{d})
		if (err == nil) != tt.ok {
			t.Errorf("mode %v: got %v, want ok=%v", tt.mode, err, tt.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "without the sticky bit") {
			t.Errorf("mode %v: %v does not say why", tt.mode, err)
		}
	}
	if err := checkScratch([]string{filepath.Join(t.TempDir(), "absent")}); err == nil {
		t.Error("a scratch directory that is not there was accepted")
	}
}

// cgroupCount reads a "key N" counter from the first file that has it:
// the memory cgroup's oom_kill (v1 memory.oom_control, v2 memory.events)
// and the pids cgroup's max.
func TestCgroupCount(t *testing.T) {
	dir := t.TempDir()
	v1 := filepath.Join(dir, "memory.oom_control")
	os.WriteFile(v1, []byte("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"), 0o644)
	v2 := filepath.Join(dir, "memory.events")
	os.WriteFile(v2, []byte("low 0\nhigh 0\nmax 9\noom 2\noom_kill 2\noom_group_kill 0\n"), 0o644)
	for _, tt := range []struct {
		files []string
		key   string
		want  int64
		ok    bool
	}{
		{[]string{v1, v2}, "oom_kill", 3, true},
		{[]string{filepath.Join(dir, "absent"), v2}, "oom_kill", 2, true},
		{[]string{v2}, "max", 9, true},
		{[]string{v2}, "oom", 2, true}, // not oom_kill's or oom_group_kill's line
		{[]string{filepath.Join(dir, "absent")}, "oom_kill", 0, false},
	} {
		if got, ok := cgroupCount(tt.files, tt.key); got != tt.want || ok != tt.ok {
			t.Errorf("%v %s: got %d %v, want %d %v", tt.files, tt.key, got, ok, tt.want, tt.ok)
		}
	}
}

// Where there is a code uid, the grader's scratch space is closed to its
// writes: root's /tmp (1777 from the image, with the candidate's group)
// becomes 1775; /work (the candidate's 0755) stays as it is, and an
// image's sticky 1777 one is closed as its owner; one the helper cannot
// close stops the job. Without a code uid nothing changes.
func TestCloseScratch(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (chown)")
	}
	const cand = 65534
	base := t.TempDir() // 0700: the candidate's uid could not reach what is in it
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(base), 0o755); err != nil {
		t.Fatal(err)
	}
	n := 0
	dir := func(mode os.FileMode, uid, gid int) string {
		n++
		d := filepath.Join(base, strconv.Itoa(n))
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, uid, gid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, mode); err != nil {
			t.Fatal(err)
		}
		return d
	}
	modeOf := func(d string) os.FileMode {
		st, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		return st.Mode() & (os.ModePerm | os.ModeSticky)
	}
	tmp, work := dir(0o777|os.ModeSticky, 0, cand), dir(0o755, cand, cand)
	if err := closeScratch(&shim.Config{UID: cand, GID: cand, CodeUID: 65533, CodeGID: 65533, Scratch: []string{work, tmp}}); err != nil {
		t.Fatal(err)
	}
	if got := modeOf(tmp); got != 0o775|os.ModeSticky {
		t.Errorf("/tmp: mode %v, want 1775", got)
	}
	if got := modeOf(work); got != 0o755 {
		t.Errorf("/work: mode %v, want 0755 as it was", got)
	}

	own := dir(0o777|os.ModeSticky, cand, cand) // an image's sticky 1777 /work: closed as its owner
	if err := closeScratch(&shim.Config{UID: cand, GID: cand, CodeUID: 65533, Scratch: []string{own}}); err != nil {
		t.Fatalf("the candidate's own 1777 scratch space: %v", err)
	}
	if got := modeOf(own); got != 0o775|os.ModeSticky {
		t.Errorf("the candidate's own scratch space: mode %v, want 1775", got)
	}
	other := dir(0o777|os.ModeSticky, 1234, 1234) // a third uid's, open to all: the helper cannot close it
	if err := closeScratch(&shim.Config{UID: cand, GID: cand, CodeUID: 65533, Scratch: []string{other}}); err == nil || !strings.Contains(err.Error(), "open to the exec service's code uid") {
		t.Errorf("a scratch space the helper cannot close: %v, want the job stopped", err)
	}
	wrongGroup := dir(0o777|os.ModeSticky, 0, 0)
	if err := closeScratch(&shim.Config{UID: cand, GID: cand, CodeUID: 65533, Scratch: []string{wrongGroup}}); err == nil {
		t.Error("a root /tmp without the candidate's group was accepted (closing it would shut the candidate out)")
	}

	open := dir(0o777|os.ModeSticky, 0, cand)
	if err := closeScratch(&shim.Config{GID: cand, Scratch: []string{open}}); err != nil {
		t.Fatal(err)
	}
	if got := modeOf(open); got != 0o777|os.ModeSticky {
		t.Errorf("no code uid: mode %v, want 1777 as it was", got)
	}
}

// The exec service's programs get the code uid's tmpfs as $TMPDIR, in
// place of the caller's; without one the caller's environment stays.
func TestWithTmpdir(t *testing.T) {
	env := []string{"PATH=/bin", "TMPDIR=/tmp", "HOME=/tmp"}
	if got, want := withTmpdir(env, "/.code-tmp"), []string{"PATH=/bin", "HOME=/tmp", "TMPDIR=/.code-tmp"}; !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if got, want := withTmpdir([]string{"PATH=/bin"}, "/.code-tmp"), []string{"PATH=/bin", "TMPDIR=/.code-tmp"}; !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := withTmpdir(env, ""); !slices.Equal(got, env) {
		t.Errorf("no code tmpfs: got %q, want %q", got, env)
	}
}
