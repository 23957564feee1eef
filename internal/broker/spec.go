package broker

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"github.com/sandboxd/sandboxd/internal/shim"
	"github.com/sandboxd/sandboxd/profiles/seccomp"
	"github.com/sandboxd/sandboxd/sandbox"
)

// Paths inside every sandbox that belong to the broker.
const (
	shimDir  = ShimDir
	shimPath = shimDir + "/shim"
)

// ShimDir is where every sandbox mounts the helper's read-only volume.
const ShimDir = sandbox.HelperPath

// The helper needs exactly these to drop to the candidate uid; the
// candidate loses them at setresuid and no_new_privs keeps it from regaining
// any (see package shim).
var helperCaps = []string{"CAP_SETGID", "CAP_SETUID"}

// oomScoreAdj makes the job's processes the kernel's first choice under
// host memory pressure (dockerd's containers have 0), leaving room above
// them, within the job, for the programs of the code uid, which the exec
// service raises to 1000 (helper.codeOOMScoreAdj): under the job's own
// memory limit, the kernel kills those first.
const oomScoreAdj = 500

// plan is everything the broker decided about one job's container.
type plan struct {
	job        *sandbox.Job
	name       string
	labels     map[string]string
	shimVolume string
	roVolumes  []mount.Mount // read-only inputs
	tmpfs      map[string]string
	seccomp    string // the JSON profile, inline
}

func (b *Broker) containerSpec(p *plan) client.ContainerCreateOptions {
	j := p.job
	l := j.Limits
	mounts := []mount.Mount{{
		Type:          mount.TypeVolume,
		Source:        p.shimVolume,
		Target:        shimDir,
		ReadOnly:      true,
		VolumeOptions: &mount.VolumeOptions{NoCopy: true},
	}}
	mounts = append(mounts, p.roVolumes...)
	pids, nproc := b.pidsLimits(j)
	init := true
	cfg := &container.Config{
		Hostname:     "sandbox",
		User:         "0:0", // the helper; candidate code runs as CandidateUID
		AttachStdin:  true,
		AttachStdout: true,
		AttachStderr: true,
		OpenStdin:    true,
		StdinOnce:    true,
		Env:          []string{shim.NonceEnv + "=" + p.labels[LabelStream]},
		Entrypoint:   []string{shimPath},
		Cmd:          []string{},
		Image:        j.Image,
		WorkingDir:   "/",
		Labels:       p.labels,
	}
	hc := &container.HostConfig{
		LogConfig:      container.LogConfig{Type: "local", Config: map[string]string{"max-size": logMaxSize(l), "max-file": "1", "compress": "false"}},
		NetworkMode:    container.NetworkMode(sandbox.NetworkNone),
		RestartPolicy:  container.RestartPolicy{Name: container.RestartPolicyDisabled},
		AutoRemove:     false,
		CapDrop:        []string{"ALL"},
		CapAdd:         slices.Clone(helperCaps),
		CgroupnsMode:   container.CgroupnsModePrivate,
		DNS:            []netip.Addr{netip.MustParseAddr("127.0.0.1")},
		IpcMode:        container.IPCModeNone,
		OomScoreAdj:    oomScoreAdj,
		Privileged:     false,
		ReadonlyRootfs: true,
		SecurityOpt:    []string{"no-new-privileges:true", "seccomp=" + p.seccomp},
		Tmpfs:          p.tmpfs,
		Runtime:        j.Runtime,
		Resources: container.Resources{
			Memory:     l.MemoryBytes,
			MemorySwap: l.MemoryBytes,
			NanoCPUs:   l.CPUMillis * 1_000_000,
			PidsLimit:  &pids,
			Ulimits:    ulimits(l, nproc),
		},
		Mounts: mounts,
		Init:   &init,
	}
	return client.ContainerCreateOptions{Config: cfg, HostConfig: hc, Name: p.name}
}

// runscHostTasks is the room a runsc sandbox's pids cgroup leaves gVisor
// beyond two host tasks for each task it may run: measured here (2 CPUs),
// the sentry and its gofer hold 36 host tasks with only the helper running,
// and every process in the sandbox adds two (its systrap stubs).
const runscHostTasks = 256

// pidsLimits returns the pids cgroup limit and RLIMIT_NPROC of a job.
//
// On runc the pids cgroup counts the sandbox's processes and threads: it is
// the job's limit, and RLIMIT_NPROC is the host-wide backstop
// (Config.NProc). On runsc the cgroup counts gVisor's own host tasks, not
// the sandbox's (gVisor's cgroups inside the sandbox show pids.max "max"),
// and reaching it panics the sentry; gVisor does enforce RLIMIT_NPROC, per
// user inside the sandbox, with EAGAIN as Linux does. So on runsc the job's
// limit is RLIMIT_NPROC, held by each of the sandbox's users (the
// candidate's, the code uid's, the helper's), and the cgroup bounds
// gVisor's tasks for all of them: 4×Pids + runscHostTasks.
func (b *Broker) pidsLimits(j *sandbox.Job) (pids, nproc int64) {
	if j.Runtime == sandbox.RuntimeRunsc {
		return 4*j.Limits.Pids + runscHostTasks, j.Limits.Pids
	}
	return j.Limits.Pids, b.cfg.NProc
}

func ulimits(l sandbox.Limits, nproc int64) []*container.Ulimit {
	return []*container.Ulimit{
		{Name: "core", Soft: 0, Hard: 0},
		{Name: "fsize", Soft: l.FileSize, Hard: l.FileSize},
		{Name: "nofile", Soft: l.OpenFiles, Hard: l.OpenFiles},
		{Name: "nproc", Soft: nproc, Hard: nproc},
	}
}

// tmpfsMounts are a job's scratch spaces: /work, the candidate uid's;
// /tmp, root's, with the candidate's group (the helper closes it to other
// uids' writes where there is a code uid: closeScratch), each of
// l.DiskBytes; and, with a code uid, that uid's own (its $TMPDIR in the
// exec service; codeTmpSize). The engines give a tmpfs the mode of the
// directory it is mounted on, whatever the mode option says. The code uid
// can write in no scratch space of the candidate's (the grader's), so a
// program it runs cannot fill it; it may still read what others may read
// there.
func tmpfsMounts(l sandbox.Limits, cand, code ids) map[string]string {
	size := strconv.FormatInt(l.DiskBytes, 10)
	m := map[string]string{
		sandbox.WorkPath: fmt.Sprintf("rw,exec,nosuid,nodev,size=%s,mode=0755,uid=%d,gid=%d", size, cand.uid, cand.gid),
		sandbox.TmpPath:  fmt.Sprintf("rw,exec,nosuid,nodev,size=%s,mode=1775,gid=%d", size, cand.gid),
	}
	if code.uid > 0 {
		m[sandbox.CodeTmpPath] = fmt.Sprintf("rw,exec,nosuid,nodev,size=%d,mode=0755,uid=%d,gid=%d", codeTmpSize(l), code.uid, code.gid)
	}
	return m
}

// codeTmpSize is the size of the code uid's tmpfs: l.DiskBytes, at most an
// eighth of the job's memory. A tmpfs's pages count against the memory
// limit and belong to no process, so on runc the kernel's OOM killer,
// wanting memory back from a program that filled it, would kill the
// grader: the bound leaves the grader seven eighths of its memory.
func codeTmpSize(l sandbox.Limits) int64 {
	return min(l.DiskBytes, l.MemoryBytes/8)
}

// ids are a uid and its gid.
type ids struct{ uid, gid int }

// SettingError names a container setting whose inspected value differs
// from what the broker asked for.
type SettingError struct {
	Setting   string
	Want, Got string
}

func (e *SettingError) Error() string {
	return fmt.Sprintf("inspected container setting %s is %s, want %s", e.Setting, e.Got, e.Want)
}

// checkInspected compares the created container with the spec it was
// created from and returns the security settings as inspected.
func (b *Broker) checkInspected(want client.ContainerCreateOptions, got container.InspectResponse) (sandbox.Security, error) {
	hc, cfg := got.HostConfig, got.Config
	if hc == nil || cfg == nil {
		return sandbox.Security{}, &SettingError{Setting: "HostConfig", Want: "present", Got: "missing"}
	}
	w := want.HostConfig
	str := func(v any) string { return fmt.Sprint(v) }
	checks := []struct {
		name      string
		want, got string
	}{
		{"Privileged", "false", str(hc.Privileged)},
		{"CapDrop", "[ALL]", str(hc.CapDrop)},
		{"CapAdd", str(sortedCaps(w.CapAdd)), str(sortedCaps(hc.CapAdd))},
		{"SecurityOpt", str(w.SecurityOpt), str(hc.SecurityOpt)},
		{"ReadonlyRootfs", "true", str(hc.ReadonlyRootfs)},
		{"NetworkMode", "none", string(hc.NetworkMode)},
		{"Dns", "[127.0.0.1]", str(hc.DNS)},
		{"DnsOptions", "[]", str(hc.DNSOptions)},
		{"DnsSearch", "[]", str(hc.DNSSearch)},
		{"ExtraHosts", "[]", str(hc.ExtraHosts)},
		{"IpcMode", "none", string(hc.IpcMode)},
		{"CgroupnsMode", "private", string(hc.CgroupnsMode)},
		{"PidMode", "", string(hc.PidMode)},
		{"UTSMode", "", string(hc.UTSMode)},
		{"UsernsMode", "", string(hc.UsernsMode)},
		{"Memory", str(w.Memory), str(hc.Memory)},
		{"MemorySwap", str(w.MemorySwap), str(hc.MemorySwap)},
		{"NanoCPUs", str(w.NanoCPUs), str(hc.NanoCPUs)},
		{"PidsLimit", str(*w.PidsLimit), ptrStr(hc.PidsLimit)},
		{"OomScoreAdj", str(w.OomScoreAdj), str(hc.OomScoreAdj)},
		{"Ulimits", ulimitStr(w.Ulimits), ulimitStr(hc.Ulimits)},
		{"Init", "true", boolPtrStr(hc.Init)},
		{"RestartPolicy", "no", string(hc.RestartPolicy.Name) + orEmpty(hc.RestartPolicy.Name)},
		{"AutoRemove", "false", str(hc.AutoRemove)},
		{"LogConfig", str(w.LogConfig), str(hc.LogConfig)},
		{"Devices", "[]", str(hc.Devices)},
		{"DeviceRequests", "[]", str(hc.DeviceRequests)},
		{"DeviceCgroupRules", "[]", str(hc.DeviceCgroupRules)},
		{"PortBindings", "0", str(len(hc.PortBindings))},
		{"PublishAllPorts", "false", str(hc.PublishAllPorts)},
		{"Binds", "[]", str(hc.Binds)},
		{"VolumesFrom", "[]", str(hc.VolumesFrom)},
		{"Links", "[]", str(hc.Links)},
		{"Sysctls", "0", str(len(hc.Sysctls))},
		{"GroupAdd", "[]", str(hc.GroupAdd)},
		{"Tmpfs", mapStr(w.Tmpfs), mapStr(hc.Tmpfs)},
		{"Mounts", mountsStr(w.Mounts), mountsStr(hc.Mounts)},
		{"MaskedPaths", "non-empty", nonEmpty(hc.MaskedPaths)},
		{"ReadonlyPaths", "non-empty", nonEmpty(hc.ReadonlyPaths)},
		{"Runtime", w.Runtime, hc.Runtime},
		{"User", "0:0", cfg.User},
		{"Entrypoint", str([]string{shimPath}), str(cfg.Entrypoint)},
		{"Tty", "false", str(cfg.Tty)},
		{"Image", want.Config.Image, got.Image},
	}
	for _, c := range checks {
		if c.want != c.got {
			return sandbox.Security{}, &SettingError{Setting: c.name, Want: c.want, Got: c.got}
		}
	}
	// Mount points the engine reports must be exactly ours: an image that
	// declares VOLUME would add an anonymous, writable one.
	for _, m := range got.Mounts {
		if m.Type == mount.TypeTmpfs {
			continue
		}
		if !slices.ContainsFunc(w.Mounts, func(x mount.Mount) bool { return x.Target == m.Destination && x.Source == m.Name && !m.RW }) {
			return sandbox.Security{}, &SettingError{Setting: "Mounts", Want: mountsStr(w.Mounts), Got: fmt.Sprintf("extra mount %s at %s (rw=%v)", m.Name, m.Destination, m.RW)}
		}
	}
	sec := sandbox.Security{
		User:           cfg.User,
		CandidateUID:   b.cfg.CandidateUID,
		CodeUID:        b.cfg.CodeUID,
		Privileged:     hc.Privileged,
		CapAdd:         sortedCaps(hc.CapAdd),
		CapDrop:        slices.Clone(hc.CapDrop),
		NoNewPrivs:     slices.Contains(hc.SecurityOpt, "no-new-privileges:true"),
		SeccompDigest:  seccomp.Digest(),
		ReadonlyRootfs: hc.ReadonlyRootfs,
		NetworkMode:    string(hc.NetworkMode),
		IpcMode:        string(hc.IpcMode),
		CgroupnsMode:   string(hc.CgroupnsMode),
		PidMode:        privateIfEmpty(string(hc.PidMode)),
		UTSMode:        privateIfEmpty(string(hc.UTSMode)),
		UsernsMode:     hostIfEmpty(string(hc.UsernsMode)),
		Memory:         hc.Memory,
		MemorySwap:     hc.MemorySwap,
		NanoCPUs:       hc.NanoCPUs,
		PidsLimit:      *hc.PidsLimit,
		OomScoreAdj:    hc.OomScoreAdj,
		Init:           *hc.Init,
		LogDriver:      hc.LogConfig.Type,
		MaskedPaths:    slices.Clone(hc.MaskedPaths),
		ReadonlyPaths:  slices.Clone(hc.ReadonlyPaths),
		Runtime:        hc.Runtime,
		Relaxations:    []string{},
	}
	for _, d := range hc.DNS {
		sec.DNS = append(sec.DNS, d.String())
	}
	for _, u := range hc.Ulimits {
		sec.Ulimits = append(sec.Ulimits, sandbox.Ulimit{Name: u.Name, Soft: u.Soft, Hard: u.Hard})
	}
	for k, v := range hc.LogConfig.Config {
		sec.LogOptions = append(sec.LogOptions, k+"="+v)
	}
	sort.Strings(sec.LogOptions)
	for k, v := range hc.Tmpfs {
		sec.Tmpfs = append(sec.Tmpfs, k+":"+v)
	}
	sort.Strings(sec.Tmpfs)
	for _, m := range hc.Mounts {
		sec.Mounts = append(sec.Mounts, sandbox.Mount{Type: string(m.Type), Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly})
	}
	return sec, nil
}

func sortedCaps(c []string) []string {
	out := make([]string, 0, len(c))
	for _, x := range c {
		x = strings.ToUpper(x)
		if !strings.HasPrefix(x, "CAP_") {
			x = "CAP_" + x
		}
		out = append(out, x)
	}
	sort.Strings(out)
	return out
}

func ptrStr(p *int64) string {
	if p == nil {
		return "unset"
	}
	return strconv.FormatInt(*p, 10)
}

func boolPtrStr(p *bool) string {
	if p == nil {
		return "unset"
	}
	return strconv.FormatBool(*p)
}

func orEmpty(s container.RestartPolicyMode) string {
	if s == "" {
		return "no"
	}
	return ""
}

func nonEmpty(s []string) string {
	if len(s) == 0 {
		return "empty"
	}
	return "non-empty"
}

// hostIfEmpty names the user namespace an empty UsernsMode gives: the
// engine's own, with the identity uid map (a daemon started with
// --userns-remap would remap it; the record would then say less than the
// truth, never more: the container's root is the host's root or weaker).
func hostIfEmpty(s string) string {
	if s == "" {
		return "host"
	}
	return s
}

// privateIfEmpty names the namespace an empty PidMode or UTSMode gives: a
// new one of the container's own.
func privateIfEmpty(s string) string {
	if s == "" {
		return "private"
	}
	return s
}

func ulimitStr(u []*container.Ulimit) string {
	parts := make([]string, 0, len(u))
	for _, x := range u {
		parts = append(parts, fmt.Sprintf("%s=%d:%d", x.Name, x.Soft, x.Hard))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func mapStr(m map[string]string) string {
	parts := make([]string, 0, len(m))
	for k, v := range m {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return strings.Join(parts, ";")
}

func mountsStr(ms []mount.Mount) string {
	parts := make([]string, 0, len(ms))
	for _, m := range ms {
		parts = append(parts, fmt.Sprintf("%s:%s:%s:ro=%v", m.Type, m.Source, m.Target, m.ReadOnly))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// logMaxSize is the max-size of a job container's own log: the helper's
// whole stream, which a broker that restarted reads back from it. It is
// the most the helper can write for the job's limits, so the log never
// rotates and every stream the live path accepts is recovered whole. The
// "local" driver is used because json-file is not binary-safe.
func logMaxSize(l sandbox.Limits) string {
	return strconv.FormatInt(shim.LogBound(l.LogBytes, l.OutputBytes, l.FileCount), 10)
}
