//go:build linux && !amd64

package probe

// ForeignABI is the ABI that TryForeignABI calls through on this
// architecture ("" where there is none to try).
const ForeignABI = ""

func foreignGetpid() int64 { panic("no foreign ABI on this architecture") }
