package probe

// Schema is the version of Report this package writes.
const Schema = "sandboxd.probe/v1"

// Report is everything the probe observed, from inside the sandbox.
type Report struct {
	Schema string `json:"schema"`
	// Kernel is the release from uname(2), as the sandbox sees it.
	Kernel   string `json:"kernel"`
	Hostname string `json:"hostname"`
	UID      int    `json:"uid"`
	GID      int    `json:"gid"`
	// Status holds the Cap*, NoNewPrivs, Seccomp, Uid and Gid lines of
	// /proc/self/status, by key.
	Status map[string]string `json:"status"`
	// Syscalls are the attempts of every denied syscall, by name.
	Syscalls []Attempt `json:"syscalls"`
	// Sockets are socket(2) attempts for families and types a candidate
	// must not get (vsock, raw, packet, AF_ALG), named like "AF_VSOCK".
	Sockets []Attempt `json:"sockets"`
	// Reads are reads of files the engine masks and of other processes'
	// secrets (/proc/1/environ).
	Reads []FileRead `json:"reads"`
	// Writes are attempts to open for writing (never written) or create
	// files that must stay read-only: /proc/sys, sysrq-trigger, the cgroup
	// tree and its release_agent, the root filesystem, read-only inputs, and
	// other processes' stdio through /proc/<pid>/fd.
	Writes []Attempt `json:"writes"`
	// RootReadOnly is statfs("/") reporting ST_RDONLY.
	RootReadOnly bool `json:"root_read_only"`
	// Interfaces are the network interfaces present.
	Interfaces []string `json:"interfaces"`
	// Connect is the TCP connection attempt to the address given with
	// -connect (a listener on the host's loopback), if any.
	Connect *NetAttempt `json:"connect,omitempty"`
	// Resolve is the name resolution attempt given with -resolve, if any.
	Resolve *NetAttempt `json:"resolve,omitempty"`
	// Env is the probe's own environment.
	Env []string `json:"env"`
	// FDs are the probe's open file descriptors at start, with their
	// targets (a leaked descriptor is how CVE-2024-21626 escaped).
	FDs        map[string]string `json:"fds"`
	Mountinfo  []string          `json:"mountinfo"`
	Cgroup     []string          `json:"cgroup"`
	ResolvConf string            `json:"resolv_conf"`
	// DevShm is the attempt to create a file in /dev/shm.
	DevShm Attempt `json:"dev_shm"`
	// ForeignABI is the attempt of a syscall through another ABI than
	// the probe's own (TryForeignABI).
	ForeignABI *ABIAttempt `json:"foreign_abi,omitempty"`
	// Namespaces are the targets of /proc/self/ns/* ("user:[4026531837]"),
	// by name: equal to the host's means the sandbox shares it.
	Namespaces map[string]string `json:"namespaces,omitempty"`
	// UIDMap and GIDMap are /proc/self/uid_map and gid_map, fields joined
	// by single spaces ("0 0 4294967295" is no user namespace of its own).
	UIDMap []string `json:"uid_map,omitempty"`
	GIDMap []string `json:"gid_map,omitempty"`
	// OOMScoreAdj is /proc/self/oom_score_adj.
	OOMScoreAdj string `json:"oom_score_adj,omitempty"`
	// Rlimits are the soft and hard limits of /proc/self/limits, by the
	// kernel's name ("Max open files": "1024 1024").
	Rlimits map[string]string `json:"rlimits,omitempty"`
	// CgroupLimits are the limit files of the sandbox's own cgroup as
	// mounted at /sys/fs/cgroup (v1 or v2), by path below it.
	CgroupLimits map[string]string `json:"cgroup_limits,omitempty"`
	// Init is /proc/1/comm: the sandbox's process 1.
	Init string `json:"init,omitempty"`
}

// Attempt is one operation and the errno it ended with ("" for success,
// otherwise the errno's name, e.g. "EPERM"). Detail adds a short note.
type Attempt struct {
	Name   string `json:"name"`
	Errno  string `json:"errno"`
	Detail string `json:"detail,omitempty"`
}

// FileRead is one read of a file: the errno of open or read, and how many
// bytes came back (capped).
type FileRead struct {
	Path  string `json:"path"`
	Errno string `json:"errno"`
	Bytes int    `json:"bytes"`
}

// NetAttempt is one network operation.
type NetAttempt struct {
	Target string   `json:"target"`
	OK     bool     `json:"ok"`
	Error  string   `json:"error,omitempty"`
	Addrs  []string `json:"addrs,omitempty"`
}

// Find returns the attempt named name in list.
func Find(list []Attempt, name string) (Attempt, bool) {
	for _, a := range list {
		if a.Name == name {
			return a, true
		}
	}
	return Attempt{}, false
}
