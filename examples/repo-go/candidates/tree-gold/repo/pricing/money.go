// Package pricing holds money in cents and the discounts a line of a cart gets.
package pricing

import "fmt"

// Money is a whole number of cents.
type Money int64

// Percent is p percent of m, rounded half up to a cent.
func (m Money) Percent(p int64) Money { return Money((int64(m)*p + 50) / 100) }

func (m Money) String() string {
	sign, c := "", int64(m)
	if c < 0 {
		sign, c = "-", -c
	}
	return fmt.Sprintf("%s%d.%02d", sign, c/100, c%100)
}
