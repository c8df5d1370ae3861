package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"unicode/utf8"
)

// What a structured-output engine guarantees — vLLM's xgrammar backend for
// response_format json_schema, a named tool_choice or "required" — the
// simulator does by construction: it writes a JSON value valid against the
// schema, drawn deterministically from a seed (the prompt's), in the layout
// of Python's json.dumps (", " and ": " separators), which is how vLLM's
// tool paths print arguments.
//
// The common subset of JSON Schema is generated: type (one, or a list of
// which the first non-null is used), properties in their written order
// (every one, required or not), required, items, prefixItems, minItems,
// maxItems, uniqueItems, enum, const, anyOf/oneOf (the first branch),
// allOf of one schema, local $ref into $defs or definitions, minimum,
// maximum, exclusiveMinimum, exclusiveMaximum, minLength, maxLength, and
// the formats date-time, date, time, email, uuid, uri, ipv4, ipv6 and
// hostname. Annotations (title, description, default, examples…) are
// ignored, as are keywords JSON Schema does not know. What cannot be
// generated with certainty — pattern, patternProperties, multipleOf, not,
// if/then/else, dependent schemas, contains, propertyNames, other formats,
// unsatisfiable bounds — is refused with an errSchema, which the handlers
// answer with a 400 naming the keyword and where it is.

// errSchema is a schema the simulator will not generate for.
var errSchema = errors.New("cannot generate JSON for this schema")

const (
	// maxSchemaDepth bounds nesting, through $ref recursion included.
	maxSchemaDepth = 32
	// minimalDepth is the depth past which only required properties and
	// minItems items are written, so recursive schemas end.
	minimalDepth = 8
	// maxGeneratedBytes bounds a generated value.
	maxGeneratedBytes = 1 << 20
)

// refusedKeywords are the keywords whose constraints the generator does
// not satisfy by construction.
var refusedKeywords = []string{
	"pattern", "patternProperties", "multipleOf", "not", "if", "then", "else",
	"dependentRequired", "dependentSchemas", "dependencies", "contains", "propertyNames",
	"unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "minContains", "maxContains",
}

// jsonGen writes one value for a schema.
type jsonGen struct {
	rng  *rand.Rand
	root *ordered // the whole schema, for $ref
	out  bytes.Buffer
}

// genJSON writes a value valid against schema (a JSON Schema document),
// deterministic in seed.
func genJSON(schema json.RawMessage, seed uint64) (string, error) {
	root, err := decodeOrdered(schema)
	if err != nil {
		return "", fmt.Errorf("%w: not JSON: %w", errSchema, err)
	}
	g := &jsonGen{rng: rand.New(rand.NewPCG(seed, 0x736368656d61))}
	if o, ok := root.(*ordered); ok {
		g.root = o
	}
	if err := g.value(root, "$", 0); err != nil {
		return "", err
	}
	return g.out.String(), nil
}

// genJSONObject writes a small JSON object, for response_format
// json_object: one or two keys, string, number or boolean values.
func genJSONObject(seed uint64) string {
	rng := rand.New(rand.NewPCG(seed, 0x6f626a656374))
	var b strings.Builder
	b.WriteByte('{')
	n := 1 + rng.IntN(2)
	used := map[string]bool{}
	for i := 0; i < n; i++ {
		k := generatedWords[rng.IntN(len(generatedWords))]
		if used[k] {
			continue
		}
		used[k] = true
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(pyString(k))
		b.WriteString(": ")
		switch rng.IntN(3) {
		case 0:
			b.WriteString(pyString(generatedWords[rng.IntN(len(generatedWords))]))
		case 1:
			b.WriteString(strconv.Itoa(rng.IntN(100)))
		default:
			b.WriteString(strconv.FormatBool(rng.IntN(2) == 0))
		}
	}
	b.WriteByte('}')
	return b.String()
}

func refuse(path, format string, args ...any) error {
	return fmt.Errorf("%w: %s at %s", errSchema, fmt.Sprintf(format, args...), path)
}

func (g *jsonGen) value(s any, path string, depth int) error {
	if depth > maxSchemaDepth {
		return refuse(path, "nesting deeper than %d (a recursive $ref without an end?)", maxSchemaDepth)
	}
	if g.out.Len() > maxGeneratedBytes {
		return refuse(path, "a value longer than %d bytes", maxGeneratedBytes)
	}
	switch v := s.(type) {
	case bool:
		if !v {
			return refuse(path, "the schema false, which nothing satisfies")
		}
		g.out.WriteString(pyString(g.words(1, 2)))
		return nil
	case *ordered:
		return g.object(v, path, depth)
	default:
		return refuse(path, "a schema that is neither an object nor a boolean")
	}
}

func (g *jsonGen) object(s *ordered, path string, depth int) error {
	for _, k := range refusedKeywords {
		if _, ok := s.get(k); ok {
			return refuse(path, "keyword %q", k)
		}
	}
	if ref, ok := s.get("$ref"); ok {
		target, err := g.resolve(ref, path)
		if err != nil {
			return err
		}
		return g.value(target, path, depth+1)
	}
	if c, ok := s.get("const"); ok {
		return g.literal(c)
	}
	if e, ok := s.get("enum"); ok {
		list, ok := e.([]any)
		if !ok || len(list) == 0 {
			return refuse(path, "enum that is not a non-empty array")
		}
		// Only the values the schema's type admits.
		var fit []any
		for _, v := range list {
			if typeAdmits(s, v) {
				fit = append(fit, v)
			}
		}
		if len(fit) == 0 {
			return refuse(path, "enum with no value of the schema's type")
		}
		return g.literal(fit[g.rng.IntN(len(fit))])
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		if alt, ok := s.get(k); ok {
			list, ok := alt.([]any)
			if !ok || len(list) == 0 {
				return refuse(path, "%s that is not a non-empty array", k)
			}
			// The first branch, with the keywords beside anyOf applying too.
			return g.value(mergeBranch(s, k, list[0]), path+"."+k+"[0]", depth+1)
		}
	}
	if all, ok := s.get("allOf"); ok {
		list, ok := all.([]any)
		if !ok || len(list) != 1 {
			return refuse(path, "allOf of other than one schema")
		}
		return g.value(list[0], path+".allOf[0]", depth+1)
	}
	typ, err := schemaType(s, path)
	if err != nil {
		return err
	}
	switch typ {
	case "object":
		return g.genObject(s, path, depth)
	case "array":
		return g.genArray(s, path, depth)
	case "string":
		return g.genString(s, path)
	case "integer", "number":
		return g.genNumber(s, path, typ == "integer")
	case "boolean":
		g.out.WriteString(strconv.FormatBool(g.rng.IntN(2) == 0))
		return nil
	case "null":
		g.out.WriteString("null")
		return nil
	default:
		return refuse(path, "type %q", typ)
	}
}

// mergeBranch is branch with the keywords of s beside key (anyOf, oneOf)
// added: required lists joined, properties merged, the branch's own
// keywords winning otherwise.
func mergeBranch(s *ordered, key string, branch any) any {
	b, ok := branch.(*ordered)
	if !ok || len(s.keys) == 1 {
		return branch
	}
	m := b.clone()
	for _, k := range s.keys {
		if k == key {
			continue
		}
		v := s.vals[k]
		cur, has := m.get(k)
		switch {
		case !has:
			m.set(k, v)
		case k == "required":
			a, _ := cur.([]any)
			c, _ := v.([]any)
			m.set(k, append(append([]any{}, a...), c...))
		case k == "properties":
			po, ok1 := cur.(*ordered)
			so, ok2 := v.(*ordered)
			if ok1 && ok2 {
				merged := so.clone()
				for _, pk := range po.keys {
					merged.set(pk, po.vals[pk])
				}
				m.set(k, merged)
			}
		}
	}
	return m
}

// typeAdmits reports whether v is of the schema's type (any, without one).
func typeAdmits(s *ordered, v any) bool {
	t, ok := s.get("type")
	if !ok {
		return true
	}
	var types []any
	switch t := t.(type) {
	case string:
		types = []any{t}
	case []any:
		types = t
	}
	for _, x := range types {
		switch x {
		case "string":
			if _, ok := v.(string); ok {
				return true
			}
		case "number", "integer":
			if n, ok := v.(json.Number); ok {
				f, err := n.Float64()
				if err == nil && (x == "number" || f == math.Trunc(f)) {
					return true
				}
			}
		case "boolean":
			if _, ok := v.(bool); ok {
				return true
			}
		case "null":
			if v == nil {
				return true
			}
		case "object":
			if _, ok := v.(*ordered); ok {
				return true
			}
		case "array":
			if _, ok := v.([]any); ok {
				return true
			}
		}
	}
	return false
}

// schemaType is the type to generate: the schema's, the first non-null of
// a list, or guessed from the keywords present (a string when none).
func schemaType(s *ordered, path string) (string, error) {
	t, ok := s.get("type")
	if !ok {
		switch {
		case s.has("properties") || s.has("required") || s.has("additionalProperties"):
			return "object", nil
		case s.has("items") || s.has("prefixItems"):
			return "array", nil
		case s.has("minimum") || s.has("maximum") || s.has("exclusiveMinimum") || s.has("exclusiveMaximum"):
			return "number", nil
		}
		return "string", nil
	}
	switch t := t.(type) {
	case string:
		return t, nil
	case []any:
		for _, x := range t {
			if name, ok := x.(string); ok && name != "null" {
				return name, nil
			}
		}
		if len(t) > 0 {
			return "null", nil
		}
	}
	return "", refuse(path, "type that is neither a string nor a list of strings")
}

func (g *jsonGen) resolve(ref any, path string) (any, error) {
	r, ok := ref.(string)
	if !ok || g.root == nil {
		return nil, refuse(path, "$ref that is not a string")
	}
	rest, ok := strings.CutPrefix(r, "#/")
	if r == "#" {
		return g.root, nil
	}
	if !ok {
		return nil, refuse(path, "$ref %q (only local references, #/$defs/NAME)", r)
	}
	var cur any = g.root
	for _, part := range strings.Split(rest, "/") {
		part = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
		o, ok := cur.(*ordered)
		if !ok {
			return nil, refuse(path, "$ref %q that leads nowhere", r)
		}
		if cur, ok = o.get(part); !ok {
			return nil, refuse(path, "$ref %q that leads nowhere", r)
		}
	}
	return cur, nil
}

func (g *jsonGen) genObject(s *ordered, path string, depth int) error {
	required := map[string]bool{}
	var requiredList []string
	if r, ok := s.get("required"); ok {
		list, ok := r.([]any)
		if !ok {
			return refuse(path, "required that is not an array")
		}
		for _, x := range list {
			name, ok := x.(string)
			if !ok {
				return refuse(path, "required that is not an array of strings")
			}
			if !required[name] {
				required[name] = true
				requiredList = append(requiredList, name)
			}
		}
	}
	props := &ordered{}
	if p, ok := s.get("properties"); ok {
		if props, ok = p.(*ordered); !ok {
			return refuse(path, "properties that is not an object")
		}
	}
	props = props.clone()
	for _, name := range requiredList {
		if !props.has(name) {
			// A required property without a schema: only additionalProperties
			// could say what it holds; a string satisfies an absent one.
			if ap, ok := s.get("additionalProperties"); ok {
				if b, isBool := ap.(bool); isBool && !b {
					return refuse(path, "required property %q that additionalProperties false forbids", name)
				}
				props.set(name, ap)
			} else {
				props.set(name, true)
			}
		}
	}
	var keys []string
	for _, k := range props.keys {
		if depth < minimalDepth || required[k] {
			keys = append(keys, k)
		}
	}
	if mn, ok := intKeyword(s, "minProperties"); ok && len(keys) < mn {
		if len(props.keys) < mn {
			return refuse(path, "minProperties %d above the %d properties named", mn, len(props.keys))
		}
		keys = props.keys[:mn]
	}
	if mx, ok := intKeyword(s, "maxProperties"); ok && len(keys) > mx {
		if len(required) > mx {
			return refuse(path, "maxProperties %d below the %d required properties", mx, len(required))
		}
		var kept []string
		for _, k := range keys {
			if required[k] || len(kept) < mx-len(required) {
				kept = append(kept, k)
			}
		}
		keys = kept
	}
	g.out.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			g.out.WriteString(", ")
		}
		g.out.WriteString(pyString(k))
		g.out.WriteString(": ")
		sub, _ := props.get(k)
		if err := g.value(sub, path+".properties."+k, depth+1); err != nil {
			return err
		}
	}
	g.out.WriteByte('}')
	return nil
}

func (g *jsonGen) genArray(s *ordered, path string, depth int) error {
	var prefix []any
	if p, ok := s.get("prefixItems"); ok {
		if prefix, ok = p.([]any); !ok {
			return refuse(path, "prefixItems that is not an array")
		}
	}
	items, hasItems := s.get("items")
	if list, ok := items.([]any); ok { // draft-07 tuple form
		prefix, items, hasItems = list, nil, false
		if extra, ok := s.get("additionalItems"); ok {
			items, hasItems = extra, true
		}
	}
	if b, ok := items.(bool); ok && !b {
		hasItems = false
	}
	mn, _ := intKeyword(s, "minItems")
	mx, hasMax := intKeyword(s, "maxItems")
	n := len(prefix)
	if hasItems && depth < minimalDepth {
		n = max(n, 1+g.rng.IntN(3))
	}
	if mn > maxGeneratedBytes/2 {
		return refuse(path, "minItems above %d", maxGeneratedBytes/2)
	}
	n = max(n, mn)
	if hasMax {
		n = min(n, mx)
	}
	if n < mn || (!hasItems && n > len(prefix)) {
		return refuse(path, "array bounds no items can meet")
	}
	unique, _ := s.get("uniqueItems")
	seen := map[string]bool{}
	g.out.WriteByte('[')
	for i := 0; i < n; i++ {
		if i > 0 {
			g.out.WriteString(", ")
		}
		sub := items
		if i < len(prefix) {
			sub = prefix[i]
		}
		if unique != true {
			if err := g.value(sub, fmt.Sprintf("%s[%d]", path, i), depth+1); err != nil {
				return err
			}
			continue
		}
		// Draw until the item differs from the others, a bounded number of
		// times: a schema with too few distinct values is refused.
		ok := false
		for try := 0; try < 16 && !ok; try++ {
			mark := g.out.Len()
			if err := g.value(sub, fmt.Sprintf("%s[%d]", path, i), depth+1); err != nil {
				return err
			}
			item := string(g.out.Bytes()[mark:])
			if ok = !seen[item]; ok {
				seen[item] = true
			} else {
				g.out.Truncate(mark)
			}
		}
		if !ok {
			return refuse(path, "uniqueItems with %d items of too few distinct values", n)
		}
	}
	g.out.WriteByte(']')
	return nil
}

func (g *jsonGen) genString(s *ordered, path string) error {
	if f, ok := s.get("format"); ok {
		v, err := g.formatted(f, path)
		if err != nil {
			return err
		}
		g.out.WriteString(pyString(v))
		return nil
	}
	mn, _ := intKeyword(s, "minLength")
	mx, hasMax := intKeyword(s, "maxLength")
	if hasMax && mx < mn {
		return refuse(path, "maxLength below minLength")
	}
	if mn > maxGeneratedBytes {
		return refuse(path, "minLength above %d", maxGeneratedBytes)
	}
	var b strings.Builder
	b.WriteString(g.words(1, 3))
	for b.Len() < mn { // the words are ASCII: bytes are characters
		b.WriteString(" " + g.words(1, 1))
	}
	v := b.String()
	if hasMax && utf8.RuneCountInString(v) > mx {
		v = string([]rune(v)[:mx])
	}
	g.out.WriteString(pyString(v))
	return nil
}

func (g *jsonGen) formatted(f any, path string) (string, error) {
	day := 1 + g.rng.IntN(28)
	switch f {
	case "date-time":
		return fmt.Sprintf("2025-06-%02dT%02d:%02d:00Z", day, g.rng.IntN(24), g.rng.IntN(60)), nil
	case "date":
		return fmt.Sprintf("2025-06-%02d", day), nil
	case "time":
		return fmt.Sprintf("%02d:%02d:00Z", g.rng.IntN(24), g.rng.IntN(60)), nil
	case "email":
		return generatedWords[g.rng.IntN(len(generatedWords))] + "@example.com", nil
	case "uuid":
		var b [16]byte
		for i := range b {
			b[i] = byte(g.rng.Uint32())
		}
		b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
		return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]), nil
	case "uri", "url", "iri", "uri-reference", "iri-reference":
		return "http://127.0.0.1/" + generatedWords[g.rng.IntN(len(generatedWords))], nil
	case "ipv4":
		return "127.0.0.1", nil
	case "ipv6":
		return "::1", nil
	case "hostname", "idn-hostname":
		return "localhost", nil
	}
	return "", refuse(path, "format %v", f)
}

func (g *jsonGen) genNumber(s *ordered, path string, integer bool) error {
	lo, hasLo := numKeyword(s, "minimum")
	hi, hasHi := numKeyword(s, "maximum")
	exLo, hasExLo := numKeyword(s, "exclusiveMinimum")
	exHi, hasExHi := numKeyword(s, "exclusiveMaximum")
	// Draft 4 writes exclusiveMinimum: true beside minimum.
	if b, ok := s.get("exclusiveMinimum"); ok && b == true && hasLo {
		exLo, hasExLo, hasLo = lo, true, false
	}
	if b, ok := s.get("exclusiveMaximum"); ok && b == true && hasHi {
		exHi, hasExHi, hasHi = hi, true, false
	}
	minV, maxV := math.Inf(-1), math.Inf(1)
	strictLo, strictHi := false, false
	if hasLo {
		minV = lo
	}
	if hasExLo && exLo >= minV {
		minV, strictLo = exLo, true
	}
	if hasHi {
		maxV = hi
	}
	if hasExHi && exHi <= maxV {
		maxV, strictHi = exHi, true
	}
	switch {
	case math.IsInf(minV, -1) && math.IsInf(maxV, 1):
		minV, maxV = 0, 100
	case math.IsInf(minV, -1):
		minV = maxV - 100
	case math.IsInf(maxV, 1):
		maxV = minV + 100
	}
	if integer {
		a, b := math.Ceil(minV), math.Floor(maxV)
		if strictLo && a == minV {
			a++
		}
		if strictHi && b == maxV {
			b--
		}
		if a > b {
			return refuse(path, "integer bounds no integer meets")
		}
		span := b - a
		if span > 1000 {
			span = 1000
		}
		g.out.WriteString(strconv.FormatFloat(a+float64(g.rng.IntN(int(span)+1)), 'f', 0, 64))
		return nil
	}
	if minV > maxV || (minV == maxV && (strictLo || strictHi)) {
		return refuse(path, "number bounds no number meets")
	}
	// A half past an integer inside the bounds, or the middle of narrow ones.
	v := math.Floor(minV) + 0.5 + float64(g.rng.IntN(int(math.Min(maxV-minV, 100))+1))
	if v <= minV || v >= maxV {
		v = minV + (maxV-minV)/2
	}
	if minV == maxV {
		v = minV
	}
	g.out.WriteString(pyFloat(v))
	return nil
}

// literal writes an enum or const value as given.
func (g *jsonGen) literal(v any) error {
	b, err := marshalOrdered(v)
	if err != nil {
		return err
	}
	g.out.Write(b)
	return nil
}

// words is between lo and hi of the simulator's words, space-separated.
func (g *jsonGen) words(lo, hi int) string {
	n := lo + g.rng.IntN(hi-lo+1)
	w := make([]string, n)
	for i := range w {
		w[i] = generatedWords[g.rng.IntN(len(generatedWords))]
	}
	return strings.Join(w, " ")
}

// intKeyword reads a count keyword (minItems, maxLength…); a count beyond
// maxGeneratedBytes reads as just beyond it, which no generated value
// needs or can meet.
func intKeyword(s *ordered, k string) (int, bool) {
	f, ok := numKeyword(s, k)
	if !ok || f < 0 {
		return 0, false
	}
	return int(math.Min(f, maxGeneratedBytes+1)), true
}

func numKeyword(s *ordered, k string) (float64, bool) {
	v, ok := s.get(k)
	if !ok {
		return 0, false
	}
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	f, err := n.Float64()
	return f, err == nil
}

// ordered is a JSON object that keeps its keys' order: properties are
// written in the order the schema lists them.
type ordered struct {
	keys []string
	vals map[string]any
}

func (o *ordered) get(k string) (any, bool) {
	v, ok := o.vals[k]
	return v, ok
}

func (o *ordered) has(k string) bool {
	_, ok := o.vals[k]
	return ok
}

func (o *ordered) clone() *ordered {
	c := &ordered{keys: append([]string(nil), o.keys...), vals: make(map[string]any, len(o.vals))}
	for k, v := range o.vals {
		c.vals[k] = v
	}
	return c
}

func (o *ordered) set(k string, v any) {
	if o.vals == nil {
		o.vals = map[string]any{}
	}
	if _, ok := o.vals[k]; !ok {
		o.keys = append(o.keys, k)
	}
	o.vals[k] = v
}

// decodeOrdered decodes JSON with objects as *ordered and numbers as
// json.Number.
func decodeOrdered(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := decodeValue(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err == nil {
		return nil, errors.New("trailing data")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			o := &ordered{vals: map[string]any{}}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				v, err := decodeValue(dec)
				if err != nil {
					return nil, err
				}
				o.set(k.(string), v)
			}
			_, err := dec.Token()
			return o, err
		case '[':
			list := []any{}
			for dec.More() {
				v, err := decodeValue(dec)
				if err != nil {
					return nil, err
				}
				list = append(list, v)
			}
			_, err := dec.Token()
			return list, err
		}
		return nil, fmt.Errorf("unexpected %v", t)
	default:
		return t, nil
	}
}

// marshalOrdered writes a decoded value back in json.dumps' layout.
func marshalOrdered(v any) ([]byte, error) {
	var b bytes.Buffer
	var write func(v any) error
	write = func(v any) error {
		switch v := v.(type) {
		case *ordered:
			b.WriteByte('{')
			for i, k := range v.keys {
				if i > 0 {
					b.WriteString(", ")
				}
				b.WriteString(pyString(k))
				b.WriteString(": ")
				if err := write(v.vals[k]); err != nil {
					return err
				}
			}
			b.WriteByte('}')
		case []any:
			b.WriteByte('[')
			for i, x := range v {
				if i > 0 {
					b.WriteString(", ")
				}
				if err := write(x); err != nil {
					return err
				}
			}
			b.WriteByte(']')
		case string:
			b.WriteString(pyString(v))
		case json.Number:
			b.WriteString(v.String())
		case bool:
			b.WriteString(strconv.FormatBool(v))
		case nil:
			b.WriteString("null")
		default:
			return fmt.Errorf("unexpected %T", v)
		}
		return nil
	}
	err := write(v)
	return b.Bytes(), err
}

// pyString is s as a JSON string, with non-ASCII kept (json.dumps with
// ensure_ascii=False, as vLLM prints tool arguments) and no HTML escaping.
func pyString(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return strings.TrimSuffix(b.String(), "\n")
}

// pyFloat formats a float as Python's repr does for the values generated:
// always with a decimal point.
func pyFloat(v float64) string {
	s := strconv.FormatFloat(v, 'g', -1, 64)
	if !strings.ContainsAny(s, ".eE") {
		s += ".0"
	}
	return s
}
