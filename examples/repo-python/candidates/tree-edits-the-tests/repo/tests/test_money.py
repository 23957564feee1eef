from pricing import Money


def test_add():
    assert Money(150) + Money(275) == Money(425)


def test_percent_rounds_half_up():
    assert Money(250).percent(10) == Money(25)
    assert Money(5).percent(10) == Money(1)
    assert Money(4).percent(10) == Money(0)


def test_str():
    assert str(Money(1234)) == "12.34"
    assert str(Money(-5)) == "-0.05"
