// Package cart is a shopping cart priced with package pricing.
package cart

import (
	"fmt"

	"shop/pricing"
)

type line struct {
	price    pricing.Money
	quantity int64
}

// Cart holds lines by SKU.
type Cart struct{ lines map[string]line }

// Add adds quantity items of sku at price; a SKU keeps its first price.
func (c *Cart) Add(sku string, price pricing.Money, quantity int64) error {
	if quantity <= 0 {
		return fmt.Errorf("quantity %d: must be positive", quantity)
	}
	if c.lines == nil {
		c.lines = map[string]line{}
	}
	l, ok := c.lines[sku]
	if ok && l.price != price {
		return fmt.Errorf("%s is already in the cart at %v", sku, l.price)
	}
	c.lines[sku] = line{price, l.quantity + quantity}
	return nil
}

// Total is the sum of the lines less their discounts.
func (c *Cart) Total() pricing.Money {
	var t pricing.Money
	for _, l := range c.lines {
		t += l.price*pricing.Money(l.quantity) - pricing.BulkDiscount(l.price, l.quantity)
	}
	return t
}
