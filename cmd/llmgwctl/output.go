package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// marshalOpts keeps every field, zero or not, so scripts reading -o json see
// a stable shape, and uses the proto field names (snake_case) like the model file.
var marshalOpts = protojson.MarshalOptions{EmitUnpopulated: true, UseProtoNames: true}

// printJSON writes v as indented JSON; proto messages go through protojson so
// enums print as names and 64-bit ints keep their precision.
func (c *cli) printJSON(v any) error {
	raw, err := toJSON(v)
	if err != nil {
		return err
	}
	out, err := json.MarshalIndent(raw, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(c.out, string(out))
	return err
}

func toJSON(v any) (any, error) {
	switch x := v.(type) {
	case proto.Message:
		b, err := marshalOpts.Marshal(x)
		if err != nil {
			return nil, err
		}
		return json.RawMessage(b), nil
	case []proto.Message:
		list := make([]any, 0, len(x))
		for _, m := range x {
			j, err := toJSON(m)
			if err != nil {
				return nil, err
			}
			list = append(list, j)
		}
		return list, nil
	default:
		return v, nil
	}
}

// printTable writes rows under a header, aligned.
func (c *cli) printTable(header []string, rows [][]string) error {
	w := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(w, strings.Join(r, "\t"))
	}
	return w.Flush()
}

func messages[T proto.Message](list []T) []proto.Message {
	out := make([]proto.Message, len(list))
	for i, m := range list {
		out[i] = m
	}
	return out
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
