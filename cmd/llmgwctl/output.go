package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// marshalOpts keeps every field, zero or not, so scripts reading -o json see
// a stable shape, and uses the proto field names (snake_case) like the model file.
var marshalOpts = protojson.MarshalOptions{EmitUnpopulated: true, UseProtoNames: true}

// printJSON writes v as indented JSON; proto messages go through protojson so
// enums print as names, then their 64-bit integers are turned back into JSON
// numbers (jsonNumbers).
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
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		v, err := decodeOrdered(dec)
		if err != nil {
			return nil, err
		}
		return jsonNumbers(x.ProtoReflect().Descriptor(), v), nil
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

// jsonNumbers rewrites the 64-bit integers of v, the protojson form of a
// message of type md, from strings into JSON numbers. protojson quotes them
// because JavaScript's numbers are doubles, but the readers of -o json are
// scripts: `jq '.[0].revision + 1'` must work, and a revision or an index
// compares as a number. The digits are kept exactly; a reader that parses
// numbers as doubles (jq does) rounds values past 2^53, which only block
// hashes reach. Well-known types (google.protobuf.*) keep their own JSON form.
func jsonNumbers(md protoreflect.MessageDescriptor, v any) any {
	obj, ok := v.(object)
	if !ok || strings.HasPrefix(string(md.FullName()), "google.protobuf.") {
		return v
	}
	for i, m := range obj {
		fd := md.Fields().ByName(protoreflect.Name(m.key))
		if fd == nil {
			continue
		}
		switch {
		case fd.IsMap():
			if entries, ok := m.value.(object); ok {
				for j := range entries {
					entries[j].value = jsonValue(fd.MapValue(), entries[j].value)
				}
			}
		case fd.IsList():
			if l, ok := m.value.([]any); ok {
				for j, e := range l {
					l[j] = jsonValue(fd, e)
				}
			}
		default:
			obj[i].value = jsonValue(fd, m.value)
		}
	}
	return obj
}

// object is a JSON object that keeps its keys in the order they were read,
// so -o json lists a message's fields in the proto's order (name first), as
// protojson wrote them.
type object []member

type member struct {
	key   string
	value any
}

func (o object) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := json.Marshal(m.key)
		if err != nil {
			return nil, err
		}
		v, err := json.Marshal(m.value)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// decodeOrdered reads one JSON value: objects as object, arrays as []any,
// numbers as json.Number (dec must UseNumber), the rest as encoding/json does.
func decodeOrdered(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch tok {
	case json.Delim('{'):
		obj := object{}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return nil, err
			}
			key, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("json: object key %v is not a string", k)
			}
			v, err := decodeOrdered(dec)
			if err != nil {
				return nil, err
			}
			obj = append(obj, member{key, v})
		}
		_, err := dec.Token() // '}'
		return obj, err
	case json.Delim('['):
		list := []any{}
		for dec.More() {
			v, err := decodeOrdered(dec)
			if err != nil {
				return nil, err
			}
			list = append(list, v)
		}
		_, err := dec.Token() // ']'
		return list, err
	}
	return tok, nil
}

// jsonValue is one value of field fd (an element, for lists and maps).
func jsonValue(fd protoreflect.FieldDescriptor, v any) any {
	switch fd.Kind() {
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind,
		protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		if s, ok := v.(string); ok && isInteger(s) {
			return json.Number(s)
		}
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return jsonNumbers(fd.Message(), v)
	case protoreflect.EnumKind:
		if s, ok := v.(string); ok && fd.Enum().FullName() != "google.protobuf.NullValue" {
			return enumWord(fd.Enum(), s)
		}
	}
	return v
}

// enumWord is an enum value as the tables print it: its name without the
// prefix every value of the enum shares, in lower case
// (REPLICA_PHASE_READY is ready, NODE_STATE_DRAINING draining), so a
// script compares -o json with the words it sees in a table.
func enumWord(ed protoreflect.EnumDescriptor, name string) string {
	return strings.ToLower(strings.TrimPrefix(name, enumPrefix(ed)))
}

// enumPrefix is the longest prefix, up to an underscore, that every value
// name of ed shares: "REPLICA_PHASE_" (proto's style guide prefixes every
// value with the enum's name).
func enumPrefix(ed protoreflect.EnumDescriptor) string {
	vals := ed.Values()
	if vals.Len() == 0 {
		return ""
	}
	prefix := string(vals.Get(0).Name())
	for i := 1; i < vals.Len(); i++ {
		name := string(vals.Get(i).Name())
		for !strings.HasPrefix(name, prefix) {
			prefix = prefix[:len(prefix)-1]
		}
	}
	if vals.Len() == 1 {
		// One value: its enum's name, as the style guide spells it.
		prefix = upperSnake(string(ed.Name())) + "_"
		if !strings.HasPrefix(string(vals.Get(0).Name()), prefix) {
			return ""
		}
		return prefix
	}
	return prefix[:strings.LastIndex(prefix, "_")+1]
}

// upperSnake is ReplicaPhase as REPLICA_PHASE.
func upperSnake(s string) string {
	var b strings.Builder
	for i, r := range s {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return strings.ToUpper(b.String())
}

// printItems writes a list command's -o json: one JSON array, an object
// per item (docs/operations.md, "-o json"), whatever the call answered
// around the items. add, if not nil, appends fields to item i: those a
// table shows that the item's message does not hold (a node's connected).
func (c *cli) printItems(items []proto.Message, add func(i int, obj object) object) error {
	list := make([]any, 0, len(items))
	for i, m := range items {
		j, err := toJSON(m)
		if err != nil {
			return err
		}
		if obj, ok := j.(object); ok && add != nil {
			j = add(i, obj)
		}
		list = append(list, j)
	}
	return c.printJSON(list)
}

// isInteger reports whether s is a decimal integer, as protojson writes
// 64-bit ones.
func isInteger(s string) bool {
	s = strings.TrimPrefix(s, "-")
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}
