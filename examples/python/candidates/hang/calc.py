# Right for small n; from fib(10) on it never returns.
def add(a, b):
    return a + b


def fib(n):
    if n < 0:
        raise ValueError("fib of a negative number")
    while n >= 10:
        pass
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a
