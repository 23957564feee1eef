package add

import "errors"

func Add(a, b int) int { return a + b }

func AddChecked(a, b int) (int, error) {
	s := a + b
	if (s > a) != (b > 0) {
		return 0, errors.New("overflow")
	}
	return s, nil
}
