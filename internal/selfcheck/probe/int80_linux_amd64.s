#include "textflag.h"

// func int80(trap uintptr) uintptr: a syscall through the i386 ABI (int
// $0x80) with no arguments, its return value.
TEXT ·int80(SB),NOSPLIT,$0-16
	MOVQ trap+0(FP), AX
	INT $0x80
	MOVQ AX, ret+8(FP)
	RET
