package api

import (
	"encoding/json"
	"errors"
)

// sniffed is all the router reads of a request body; the body itself is
// forwarded byte for byte (plan §7.1).
type sniffed struct {
	Model  string
	Stream bool
}

// sniff reads model and stream from a JSON request body. Keys match
// exactly, as the engines' own parsers do (encoding/json would also accept
// "Model"), and the whole body must be valid JSON, so the router refuses
// what the engine would refuse rather than forward garbage.
func sniff(body []byte) (sniffed, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return sniffed{}, errInvalidJSON(err)
	}
	if fields == nil {
		return sniffed{}, errInvalidJSON(errors.New("the body must be a JSON object"))
	}
	var out sniffed
	raw, ok := fields["model"]
	if !ok {
		return sniffed{}, errInvalidField("model", "model is required")
	}
	if err := json.Unmarshal(raw, &out.Model); err != nil {
		return sniffed{}, errInvalidField("model", "model must be a string")
	}
	if out.Model == "" {
		return sniffed{}, errInvalidField("model", "model must not be empty")
	}
	if raw, ok := fields["stream"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &out.Stream); err != nil {
			return sniffed{}, errInvalidField("stream", "stream must be a boolean")
		}
	}
	return out, nil
}
