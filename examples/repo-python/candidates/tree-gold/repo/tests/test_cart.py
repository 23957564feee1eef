import pytest

from pricing import Money
from shop import Cart


def test_total_without_discount():
    c = Cart()
    c.add("pen", Money(150), 2)
    c.add("pad", Money(325))
    assert c.total() == Money(625)


def test_total_with_ten_of_a_kind():
    c = Cart()
    c.add("pen", Money(150), 4)
    c.add("pen", Money(150), 6)
    c.add("pad", Money(325))
    assert c.total() == Money(1675)


def test_add_refuses_another_price():
    c = Cart()
    c.add("pen", Money(150))
    with pytest.raises(ValueError):
        c.add("pen", Money(160))
