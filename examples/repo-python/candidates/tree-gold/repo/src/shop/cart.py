"""A cart: lines of (sku, unit price, quantity), totalled with discounts."""

from pricing import Money, bulk_discount


class Cart:
    def __init__(self):
        self._lines = {}

    def add(self, sku, unit_price, quantity=1):
        if quantity <= 0:
            raise ValueError("quantity must be positive")
        price, held = self._lines.get(sku, (unit_price, 0))
        if price != unit_price:
            raise ValueError(f"{sku} is already in the cart at {price}")
        self._lines[sku] = (unit_price, held + quantity)

    def quantity(self, sku):
        return self._lines.get(sku, (None, 0))[1]

    def subtotal(self):
        total = Money(0)
        for price, quantity in self._lines.values():
            total = total + price.times(quantity)
        return total

    def discount(self):
        total = Money(0)
        for price, quantity in self._lines.values():
            total = total + bulk_discount(price, quantity)
        return total

    def total(self):
        return self.subtotal() - self.discount()
