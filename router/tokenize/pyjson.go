package tokenize

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// pythonJSON writes the JSON value raw as Python's json.dumps writes the
// value Python decoded from it, with its defaults: ", " and ": " between
// items, every character outside printable ASCII escaped (\uXXXX,
// surrogate pairs above the BMP), keys in the order written. vLLM writes a
// tool_use block's input that way into the tool call's arguments
// (json.dumps(block.input)), so the router must too for the prompt's
// tokens to be the engine's.
//
// A float (a number with a fraction or an exponent) is refused: Python
// writes the float it parsed (1e2 as 100.0, 1.10 as 1.1), whose shortest
// form this does not reproduce; so is an object repeating a key (Python
// keeps the last value at the first key's place). Both route by tier 1.
func pythonJSON(raw []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var b strings.Builder
	if err := pyValue(dec, &b); err != nil {
		return "", err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("%w: tool_use input: trailing data", ErrUnsupported)
	}
	return b.String(), nil
}

func pyValue(dec *json.Decoder, b *strings.Builder) error {
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("%w: tool_use input: %w", ErrUnsupported, err)
	}
	switch v := tok.(type) {
	case json.Delim:
		switch v {
		case '{':
			b.WriteByte('{')
			seen := map[string]bool{}
			for i := 0; dec.More(); i++ {
				kt, err := dec.Token()
				if err != nil {
					return fmt.Errorf("%w: tool_use input: %w", ErrUnsupported, err)
				}
				k, _ := kt.(string)
				if seen[k] {
					return fmt.Errorf("%w: tool_use input repeats the key %q", ErrUnsupported, k)
				}
				seen[k] = true
				if i > 0 {
					b.WriteString(", ")
				}
				pyString(b, k)
				b.WriteString(": ")
				if err := pyValue(dec, b); err != nil {
					return err
				}
			}
			b.WriteByte('}')
		case '[':
			b.WriteByte('[')
			for i := 0; dec.More(); i++ {
				if i > 0 {
					b.WriteString(", ")
				}
				if err := pyValue(dec, b); err != nil {
					return err
				}
			}
			b.WriteByte(']')
		}
		if _, err := dec.Token(); err != nil { // the closing delimiter
			return fmt.Errorf("%w: tool_use input: %w", ErrUnsupported, err)
		}
	case string:
		pyString(b, v)
	case json.Number:
		s := v.String()
		if strings.ContainsAny(s, ".eE") {
			return fmt.Errorf("%w: tool_use input has a float", ErrUnsupported)
		}
		if s == "-0" {
			s = "0"
		}
		b.WriteString(s)
	case bool:
		if v {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case nil:
		b.WriteString("null")
	}
	return nil
}

// pyString writes s as json.dumps does with ensure_ascii: printable ASCII
// as it is but for the quote and the backslash; \n, \r, \t, \b, \f by
// name; everything else as \uXXXX.
func pyString(b *strings.Builder, s string) {
	const hex = "0123456789abcdef"
	u := func(r rune) {
		b.WriteString(`\u`)
		b.WriteByte(hex[r>>12&0xf])
		b.WriteByte(hex[r>>8&0xf])
		b.WriteByte(hex[r>>4&0xf])
		b.WriteByte(hex[r&0xf])
	}
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r >= 0x20 && r <= 0x7e:
			b.WriteByte(byte(r))
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			u(r1)
			u(r2)
		case r == utf8.RuneError:
			u(0xfffd)
		default:
			u(r)
		}
	}
	b.WriteByte('"')
}
