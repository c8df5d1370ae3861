package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// validateJSON checks text against schema with an independent validator
// (formats asserted).
func validateJSON(t *testing.T, schema, text string) {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatalf("schema: %v", err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource("mem:///schema.json", doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("mem:///schema.json")
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		t.Fatalf("generated text is not JSON: %v\n%s", err, text)
	}
	if err := sch.Validate(v); err != nil {
		t.Errorf("generated JSON is not valid against the schema: %v\n%s", err, text)
	}
}

func TestGenJSONValidAgainstSchema(t *testing.T) {
	tests := []struct{ name, schema string }{
		{"object with required", `{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer","minimum":1,"maximum":7}},"required":["city","days"],"additionalProperties":false}`},
		{"every scalar", `{"type":"object","properties":{"s":{"type":"string"},"n":{"type":"number"},"i":{"type":"integer"},"b":{"type":"boolean"},"z":{"type":"null"}}}`},
		{"enum and const", `{"type":"object","properties":{"unit":{"enum":["c","f"]},"v":{"const":{"a":[1,2]}}},"required":["unit","v"]}`},
		{"nested arrays", `{"type":"array","minItems":2,"maxItems":4,"items":{"type":"object","properties":{"tags":{"type":"array","items":{"type":"string"}}},"required":["tags"]}}`},
		{"string lengths", `{"type":"string","minLength":40,"maxLength":45}`},
		{"short string", `{"type":"string","maxLength":3}`},
		{"exclusive bounds", `{"type":"object","properties":{"x":{"type":"number","exclusiveMinimum":0,"exclusiveMaximum":1},"k":{"type":"integer","exclusiveMinimum":5,"exclusiveMaximum":7}}}`},
		{"negative range", `{"type":"integer","minimum":-50,"maximum":-40}`},
		{"type list", `{"type":["null","string"]}`},
		{"nullable anyOf", `{"type":"object","properties":{"x":{"anyOf":[{"type":"integer"},{"type":"null"}]}},"required":["x"]}`},
		{"refs", `{"$defs":{"Point":{"type":"object","properties":{"x":{"type":"number"},"y":{"type":"number"}},"required":["x","y"]}},"type":"object","properties":{"a":{"$ref":"#/$defs/Point"},"b":{"$ref":"#/$defs/Point"}},"required":["a","b"]}`},
		{"recursive ref", `{"$defs":{"Node":{"type":"object","properties":{"name":{"type":"string"},"children":{"type":"array","items":{"$ref":"#/$defs/Node"}}},"required":["name"]}},"$ref":"#/$defs/Node"}`},
		{"formats", `{"type":"object","properties":{"when":{"type":"string","format":"date-time"},"day":{"type":"string","format":"date"},"id":{"type":"string","format":"uuid"},"mail":{"type":"string","format":"email"},"ip":{"type":"string","format":"ipv4"},"at":{"type":"string","format":"time"}}}`},
		{"unique items", `{"type":"array","items":{"enum":["a","b","c","d","e"]},"minItems":3,"uniqueItems":true}`},
		{"tuple", `{"type":"array","prefixItems":[{"type":"integer"},{"type":"string"}],"items":false}`},
		{"required without properties", `{"type":"object","required":["x"]}`},
		{"allOf of one", `{"allOf":[{"type":"object","properties":{"q":{"type":"boolean"}},"required":["q"]}]}`},
		{"annotations ignored", `{"$schema":"https://json-schema.org/draft/2020-12/schema","title":"T","description":"d","type":"object","properties":{"a":{"type":"string","default":"x","examples":["y"]}}}`},
		{"empty schema", `{}`},
		{"enum filtered by type", `{"type":"integer","enum":["a",1,2.5,3]}`},
		{"anyOf beside properties", `{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"boolean"}},"anyOf":[{"required":["a"]},{"required":["b"]}]}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for seed := range uint64(20) {
				text, err := genJSON(json.RawMessage(tc.schema), seed)
				if err != nil {
					t.Fatalf("seed %d: %v", seed, err)
				}
				validateJSON(t, tc.schema, text)
				if t.Failed() {
					return
				}
			}
		})
	}
}

func TestGenJSONDeterministicAndOrdered(t *testing.T) {
	schema := json.RawMessage(`{"type":"object","properties":{"zeta":{"type":"string"},"alpha":{"type":"integer"}},"required":["zeta","alpha"]}`)
	a, err := genJSON(schema, 7)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := genJSON(schema, 7)
	c, _ := genJSON(schema, 8)
	if a != b {
		t.Errorf("same seed, different JSON: %s vs %s", a, b)
	}
	if a == c {
		t.Errorf("different seeds, same JSON %s (want variety)", a)
	}
	if !strings.HasPrefix(a, `{"zeta": `) || !strings.Contains(a, `, "alpha": `) {
		t.Errorf("want the schema's property order and json.dumps separators: %s", a)
	}
}

func TestGenJSONRefuses(t *testing.T) {
	tests := []struct{ name, schema, want string }{
		{"pattern", `{"type":"object","properties":{"code":{"type":"string","pattern":"^[A-Z]{3}$"}}}`, `keyword "pattern" at $`},
		{"multipleOf", `{"type":"integer","multipleOf":7}`, `"multipleOf"`},
		{"not", `{"not":{"type":"string"}}`, `"not"`},
		{"unknown format", `{"type":"string","format":"credit-card"}`, `format credit-card at $`},
		{"remote ref", `{"$ref":"https://example.com/x.json"}`, `only local references`},
		{"dangling ref", `{"$ref":"#/$defs/Nope"}`, `leads nowhere`},
		{"impossible integer", `{"type":"integer","minimum":1.2,"maximum":1.8}`, `no integer meets`},
		{"false schema", `false`, `the schema false`},
		{"endless recursion", `{"$defs":{"A":{"type":"object","properties":{"a":{"$ref":"#/$defs/A"}},"required":["a"]}},"$ref":"#/$defs/A"}`, `nesting deeper`},
		{"too few unique values", `{"type":"array","items":{"type":"boolean"},"minItems":3,"uniqueItems":true}`, `uniqueItems`},
		{"not JSON", `{"type":`, `not JSON`},
		{"enum of the wrong type", `{"type":"string","enum":[1,2]}`, `no value of the schema's type`},
		{"huge minLength", `{"type":"string","minLength":1e12}`, `minLength above`},
		{"huge minItems", `{"type":"array","items":{"type":"null"},"minItems":1e9}`, `minItems above`},
		{"too long", `{"type":"array","items":{"type":"string","minLength":1000},"minItems":2000}`, `a value longer than`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := genJSON(json.RawMessage(tc.schema), 1)
			if !errors.Is(err, errSchema) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want errSchema naming %q", err, tc.want)
			}
		})
	}
}

func TestGenJSONObject(t *testing.T) {
	for seed := range uint64(50) {
		text := genJSONObject(seed)
		var v map[string]any
		if err := json.Unmarshal([]byte(text), &v); err != nil || len(v) == 0 {
			t.Fatalf("seed %d: %q is not a non-empty JSON object: %v", seed, text, err)
		}
	}
}

// FuzzGenJSON: any schema either generates valid JSON or is refused with
// errSchema; nothing panics or runs away.
func FuzzGenJSON(f *testing.F) {
	for _, seed := range []string{
		weatherSchema, `{"$defs":{"N":{"type":"array","items":{"$ref":"#/$defs/N"}}},"$ref":"#/$defs/N"}`,
		`{"type":["integer","null"],"minimum":-3,"exclusiveMaximum":-2}`, `{"enum":[{"a":[1,{"b":null}]},"x"]}`,
		`{"type":"array","prefixItems":[true,false],"minItems":2}`, `{"anyOf":[]}`, `[]`, `7`,
	} {
		f.Add([]byte(seed), uint64(1))
	}
	f.Fuzz(func(t *testing.T, schema []byte, seed uint64) {
		text, err := genJSON(schema, seed)
		if err != nil {
			if !errors.Is(err, errSchema) {
				t.Fatalf("error outside errSchema: %v", err)
			}
			return
		}
		if !json.Valid([]byte(text)) {
			t.Fatalf("schema %s gave invalid JSON %q", schema, text)
		}
		// Where the independent validator can read the schema, the value
		// must satisfy it.
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
		if err != nil {
			return
		}
		c := jsonschema.NewCompiler()
		c.AssertFormat()
		if c.AddResource("mem:///schema.json", doc) != nil {
			return
		}
		sch, err := c.Compile("mem:///schema.json")
		if err != nil {
			return
		}
		v, _ := jsonschema.UnmarshalJSON(strings.NewReader(text))
		if err := sch.Validate(v); err != nil {
			t.Fatalf("schema %s gave %s, invalid: %v", schema, text, err)
		}
	})
}
