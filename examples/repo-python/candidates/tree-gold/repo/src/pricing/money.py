"""Money as a whole number of cents, never a float."""


class Money:
    __slots__ = ("cents",)

    def __init__(self, cents):
        if not isinstance(cents, int):
            raise TypeError("cents must be an int")
        self.cents = cents

    def __add__(self, other):
        return Money(self.cents + other.cents)

    def __sub__(self, other):
        return Money(self.cents - other.cents)

    def times(self, n):
        return Money(self.cents * n)

    def percent(self, p):
        """p percent of this amount, rounded half up to a cent."""
        return Money((self.cents * p + 50) // 100)

    def __eq__(self, other):
        return isinstance(other, Money) and self.cents == other.cents

    def __repr__(self):
        return f"Money({self.cents})"

    def __str__(self):
        sign = "-" if self.cents < 0 else ""
        return f"{sign}{abs(self.cents) // 100}.{abs(self.cents) % 100:02d}"
