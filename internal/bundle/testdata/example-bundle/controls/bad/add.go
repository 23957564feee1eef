package add

func Add(a, b int) int { return a - b }

func AddChecked(a, b int) (int, error) { return a + b, nil }
