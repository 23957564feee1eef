# Wrong answers that compare equal to anything.
class Anything(int):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = int.__hash__


def add(a, b):
    return Anything(0)


def fib(n):
    if n < 0:
        raise ValueError("fib of a negative number")
    return Anything(-1)
