"""Prices: money in cents and the discounts a line of a cart gets."""

from pricing.money import Money
from pricing.discounts import bulk_discount

__all__ = ["Money", "bulk_discount"]
