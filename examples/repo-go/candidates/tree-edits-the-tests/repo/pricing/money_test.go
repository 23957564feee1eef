package pricing

import "testing"

func TestPercentRoundsHalfUp(t *testing.T) {
	for _, c := range []struct{ m, p, want Money }{{250, 10, 25}, {5, 10, 1}, {4, 10, 0}} {
		if got := c.m.Percent(int64(c.p)); got != c.want {
			t.Errorf("%d.Percent(%d) = %d, want %d", c.m, c.p, got, c.want)
		}
	}
}

func TestString(t *testing.T) {
	if got := Money(1234).String(); got != "12.34" {
		t.Errorf("got %q, want 12.34", got)
	}
	if got := Money(-5).String(); got != "-0.05" {
		t.Errorf("got %q, want -0.05", got)
	}
}
