package configfile

import (
	"encoding"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"go.yaml.in/yaml/v3"
)

// This file names the key of every value that does not fit its setting,
// and of every key that is no setting.
// yaml.v3 reports a wrong type by line alone ("line 3: cannot unmarshal
// !!seq into time.Duration"), and it silently truncates a number with a
// fraction or an exponent into an integer setting (replicas: 1.5 became 1,
// and 1e9 a billion). So the document is walked next to the Go type it
// decodes into: each value that is not a mapping or a sequence the type
// goes into is decoded on its own, and its error is reported under its key
// path as the user wrote it ("gossip.reconnect_interval",
// "adapters[1].name"); a float where the setting is an integer is refused
// there too.

var (
	unmarshalerType     = reflect.TypeFor[yaml.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// keyProblems walks doc (a parsed document) against t, the type it decodes
// into, and returns one problem per value that does not fit, each starting
// with its key path, and the lines they are on.
func keyProblems(doc *yaml.Node, t reflect.Type) (problems []string, lines map[int]bool) {
	w := walker{lines: map[int]bool{}}
	n := doc
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return nil, nil
		}
		n = n.Content[0]
	}
	w.walk(n, t, "")
	return w.problems, w.lines
}

type walker struct {
	problems []string
	lines    map[int]bool
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func (w *walker) add(line int, path, msg string) {
	if path == "" {
		path = "(document)"
	}
	w.problems = append(w.problems, path+": "+msg)
	w.lines[line] = true
}

// walk checks n against t. Aliases are not followed: the anchored value is
// checked where it is written, and following them would let a document of
// nested aliases cost far more than its size.
func (w *walker) walk(n *yaml.Node, t reflect.Type, path string) {
	if n.Kind == yaml.AliasNode || n.ShortTag() == "!!null" {
		return
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if custom(t) {
		w.leaf(n, t, path, false)
		return
	}
	switch {
	case t.Kind() == reflect.Struct && n.Kind == yaml.MappingNode:
		fields := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				continue // the strict decoder says
			}
			if ft, ok := fields[k.Value]; ok {
				w.walk(v, ft, join(path, k.Value))
			} else if k.Value != "<<" {
				// Named by its path, where yaml.v3 names the Go type it
				// decodes into ("field foo not found in type main.modelFile").
				w.add(k.Line, join(path, k.Value), fmt.Sprintf("line %d: unknown key", k.Line))
			}
			// A merge ("<<"): the strict decoder says.
		}
	case t.Kind() == reflect.Map && n.Kind == yaml.MappingNode && t.Key().Kind() == reflect.String:
		for i := 0; i+1 < len(n.Content); i += 2 {
			w.walk(n.Content[i+1], t.Elem(), join(path, n.Content[i].Value))
		}
	case (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) && t.Elem().Kind() != reflect.Uint8 && n.Kind == yaml.SequenceNode:
		for i, item := range n.Content {
			w.walk(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
		}
	default:
		w.leaf(n, t, path, true)
	}
}

// custom reports whether t decodes itself (yaml.Unmarshaler,
// encoding.TextUnmarshaler): its value is checked whole.
func custom(t reflect.Type) bool {
	pt := reflect.PointerTo(t)
	return t.Implements(unmarshalerType) || pt.Implements(unmarshalerType) ||
		t.Implements(textUnmarshalerType) || pt.Implements(textUnmarshalerType)
}

// leaf decodes n alone into a new t and reports what is wrong with it under
// path. With ints, a float (1.5, 1e9) is refused even where yaml.v3 would
// truncate it.
func (w *walker) leaf(n *yaml.Node, t reflect.Type, path string, ints bool) {
	if err := n.Decode(reflect.New(t).Interface()); err != nil {
		var te *yaml.TypeError
		if errors.As(err, &te) {
			if k := t.Kind(); k == reflect.Struct || k == reflect.Map {
				// yaml.v3 would name the Go type ("into main.modelFile").
				w.add(n.Line, path, fmt.Sprintf("line %d: must be a mapping of keys, got %s", n.Line, n.ShortTag()))
				return
			}
			for _, e := range te.Errors {
				w.add(n.Line, path, e)
			}
			return
		}
		msg := strings.TrimPrefix(err.Error(), "yaml: ")
		if strings.HasPrefix(msg, path+": ") {
			msg = strings.TrimPrefix(msg, path+": ") // a type that names its key itself
		}
		w.add(n.Line, path, fmt.Sprintf("line %d: %s", n.Line, msg))
		return
	}
	if !ints || n.Kind != yaml.ScalarNode || n.ShortTag() != "!!float" {
		return
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		w.add(n.Line, path, fmt.Sprintf("line %d: must be a whole number, got %s", n.Line, n.Value))
	}
}

// yamlFields maps the keys of a struct as yaml.v3 reads them to their
// field types: the yaml tag's name, or the field's name in lower case;
// "-" and unexported fields are skipped, and ",inline" structs contribute
// their own keys.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if f.PkgPath != "" && !f.Anonymous {
			continue
		}
		tag := f.Tag.Get("yaml")
		if tag == "" && !strings.Contains(string(f.Tag), ":") {
			tag = string(f.Tag)
		}
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if strings.Contains(","+opts+",", ",inline,") {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for k, v := range yamlFields(ft) {
					out[k] = v
				}
			}
			continue
		}
		if f.PkgPath != "" {
			continue // an unexported embedded type without ",inline"
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = f.Type
	}
	return out
}

// KeyLines maps the key path of every value in the single YAML document of
// b, as Strict's problems name them ("replicas", "autoscale.min",
// "adapters[1].name"), to the line it is written on, so a problem found
// after decoding (a value out of range, a rule of validation) can say the
// line too. A document that is not YAML maps nothing.
func KeyLines(b []byte) map[string]int {
	var doc yaml.Node
	if yaml.Unmarshal(b, &doc) != nil || len(doc.Content) == 0 {
		return nil
	}
	lines := map[string]int{}
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k := join(path, n.Content[i].Value)
				lines[k] = n.Content[i].Line
				walk(n.Content[i+1], k)
			}
		case yaml.SequenceNode:
			for i, item := range n.Content {
				k := fmt.Sprintf("%s[%d]", path, i)
				lines[k] = item.Line
				walk(item, k)
			}
		}
		// Aliases are not followed, as in walk.
	}
	walk(doc.Content[0], "")
	return lines
}
