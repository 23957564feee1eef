"""Bulk discounts: a line of BULK_QUANTITY items or more gets BULK_PERCENT off."""

from pricing.money import Money

BULK_QUANTITY = 10
BULK_PERCENT = 10


def bulk_discount(unit_price, quantity):
    """The discount on a line of quantity items at unit_price."""
    if quantity >= BULK_QUANTITY:
        return unit_price.times(quantity).percent(BULK_PERCENT)
    return Money(0)
