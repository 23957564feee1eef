package pricing

// A line of BulkQuantity items or more gets BulkPercent off.
const (
	BulkQuantity = 10
	BulkPercent  = 10
)

// BulkDiscount is the discount on a line of quantity items at unit.
func BulkDiscount(unit Money, quantity int64) Money {
	if quantity >= BulkQuantity {
		return (unit * Money(quantity)).Percent(BulkPercent)
	}
	return 0
}
