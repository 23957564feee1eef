"""A shopping cart priced with the pricing package."""

from shop.cart import Cart

__all__ = ["Cart"]
