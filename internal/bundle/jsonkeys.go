package bundle

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// checkKeys walks a JSON document and refuses what encoding/json would
// silently accept: a key given twice (the last one would win) and a key in
// another case than the field's name (json matches names case-insensitively).
// Every bundle.json key is lowercase snake_case.
func checkKeys(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	depth := 0
	var walk func(path string) error
	walk = func(path string) error {
		depth++
		defer func() { depth-- }()
		if depth > 32 {
			return manifestErr(path, "nested more than 32 levels")
		}
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return err
				}
				key := k.(string)
				field := strings.TrimPrefix(path+"."+key, ".")
				if seen[key] {
					return manifestErr(field, "given twice")
				}
				seen[key] = true
				if !snakeCase(key) {
					return manifestErr(field, "unknown field (names are lowercase snake_case)")
				}
				if err := walk(field); err != nil {
					return err
				}
			}
			_, err = dec.Token() // '}'
			return err
		case json.Delim('['):
			for i := 0; dec.More(); i++ {
				if err := walk(fmt.Sprintf("%s[%d]", path, i)); err != nil {
					return err
				}
			}
			_, err = dec.Token() // ']'
			return err
		}
		return nil
	}
	return walk("")
}

func snakeCase(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}
