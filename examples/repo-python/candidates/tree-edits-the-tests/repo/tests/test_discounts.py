from pricing import Money, bulk_discount


def test_no_discount_below_threshold():
    assert bulk_discount(Money(200), 9) == Money(0)


def test_discount_at_threshold():
    assert bulk_discount(Money(200), 10) == Money(0)


def test_discount_above_threshold():
    assert bulk_discount(Money(199), 12) == Money(239)
