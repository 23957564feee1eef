package pricing

import "testing"

func TestNoDiscountBelowThreshold(t *testing.T) {
	if got := BulkDiscount(200, 9); got != 0 {
		t.Errorf("BulkDiscount(200, 9) = %d, want 0", got)
	}
}

func TestDiscountAtThreshold(t *testing.T) {
	if got := BulkDiscount(200, 10); got != 200 {
		t.Errorf("BulkDiscount(200, 10) = %d, want 200", got)
	}
}

func TestDiscountAboveThreshold(t *testing.T) {
	if got := BulkDiscount(199, 12); got != 239 {
		t.Errorf("BulkDiscount(199, 12) = %d, want 239", got)
	}
}
