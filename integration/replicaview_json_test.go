package integration

import (
	"bytes"
	"encoding/json"
	"slices"
)

// UnmarshalJSON reads `llmgwctl replica list -o json` both as it was (64-bit
// integers quoted, protojson's way) and as it is since llmgwctl writes them
// as JSON numbers: the view keeps uid and incarnation, its 64-bit fields, as
// the decimal strings the tests compare and parse.
func (r *replicaView) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return err
	}
	q, err := json.Marshal(quoteKeys(v, "uid", "incarnation"))
	if err != nil {
		return err
	}
	type plain replicaView // without this method
	return json.Unmarshal(q, (*plain)(r))
}

// quoteKeys turns the JSON numbers under any of keys, at any depth of v,
// into their decimal strings.
func quoteKeys(v any, keys ...string) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if n, ok := e.(json.Number); ok && slices.Contains(keys, k) {
				x[k] = n.String()
				continue
			}
			x[k] = quoteKeys(e, keys...)
		}
	case []any:
		for i, e := range x {
			x[i] = quoteKeys(e, keys...)
		}
	}
	return v
}
