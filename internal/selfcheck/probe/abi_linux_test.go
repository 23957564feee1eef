package probe

import (
	"errors"
	"testing"
)

// faultErr is a memory fault's panic value, as the runtime makes it under
// debug.SetPanicOnFault.
type faultErr struct{ error }

func (faultErr) Addr() uintptr { return 0 }

// Only a memory fault's panic counts as the kernel refusing the ABI; any
// other panic of the attempt is the probe's failure, not a refusal.
func TestPanicOutcomeRefusesOnlyAFault(t *testing.T) {
	for _, tc := range []struct {
		e       any
		refused bool
	}{
		{faultErr{errors.New("runtime error: invalid memory address or nil pointer dereference")}, true},
		{errors.New("runtime error: index out of range"), false},
		{"a string", false},
	} {
		a := ABIAttempt{ABI: "i386", Outcome: panicOutcome(tc.e)}
		if a.Refused() != tc.refused {
			t.Errorf("panic %v: outcome %q, refused %t; want refused %t", tc.e, a.Outcome, a.Refused(), tc.refused)
		}
	}
}
