package cart

import "testing"

func TestTotalWithoutDiscount(t *testing.T) {
	var c Cart
	c.Add("pen", 150, 2)
	c.Add("pad", 325, 1)
	if got := c.Total(); got != 625 {
		t.Errorf("Total() = %d, want 625", got)
	}
}

func TestTotalWithTenOfAKind(t *testing.T) {
	var c Cart
	c.Add("pen", 150, 4)
	c.Add("pen", 150, 6)
	c.Add("pad", 325, 1)
	if got := c.Total(); got != 1675 {
		t.Errorf("Total() = %d, want 1675", got)
	}
}

func TestAddRefusesAnotherPrice(t *testing.T) {
	var c Cart
	c.Add("pen", 150, 1)
	if err := c.Add("pen", 160, 1); err == nil {
		t.Error("Add at another price: no error")
	}
}
