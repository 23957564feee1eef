package calc

import "testing"

func TestAdd(t *testing.T) {
	for _, c := range []struct{ a, b, want int }{{1, 2, 3}, {-4, 4, 0}, {1 << 40, 1, 1<<40 + 1}} {
		if got := Add(c.a, c.b); got != c.want {
			t.Errorf("Add(%d, %d) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

func TestFib(t *testing.T) {
	for n, want := range []int{0, 1, 1, 2, 3, 5, 8, 13, 21, 34} {
		if got := Fib(n); got != want {
			t.Errorf("Fib(%d) = %d, want %d", n, got, want)
		}
	}
}

func TestFibLarge(t *testing.T) {
	if got, want := Fib(90), 2880067194370816120; got != want {
		t.Errorf("Fib(90) = %d, want %d", got, want)
	}
}
