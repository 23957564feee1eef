def add(a, b):
    return a + b


def fib(n):
    if n < 0:
        raise ValueError("fib of a negative number")
    a, b = 1, 1
    for _ in range(n):
        a, b = b, a + b
    return a
