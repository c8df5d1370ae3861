package openai

import "encoding/json"

// WithModel returns body with `model` set to name: a request that named an
// alias goes to the engine under the name the engine serves, its target's
// (design §7.9). Like the other edits (rewrite.go), only that field
// changes; everything else reaches the engine byte for byte.
func WithModel(body []byte, name string) ([]byte, error) {
	m, err := json.Marshal(name)
	if err != nil {
		return nil, err
	}
	return setFields(body, setting{"model", string(m)})
}
