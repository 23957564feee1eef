package probe

// int80 makes the syscall trap through the i386 ABI (int $0x80), no
// arguments, and returns what the kernel answered in eax.
func int80(trap uintptr) uintptr

// i386Getpid is getpid's number in the i386 ABI.
const i386Getpid = 20

// ForeignABI is the ABI that TryForeignABI calls through on this
// architecture ("" where there is none to try).
const ForeignABI = "i386"

func foreignGetpid() int64 { return int64(int32(int80(i386Getpid))) }
