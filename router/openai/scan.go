package openai

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// The router reads a handful of fields of every request body and edits
// at most two. encoding/json would decode the whole body into maps and
// raw messages to do so, allocating for every field and scanning the
// body again for every question asked of it; the scanner here walks a
// body the caller has already checked with json.Valid, without
// allocating, and hands back where each value lies. It never decides
// whether JSON is valid: on malformed input it reports failure (-1)
// rather than guessing, and never reads out of bounds.

// skipWS returns the offset of the first non-space byte at or after i.
func skipWS(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// skipString returns the offset just past the string starting at b[i]
// (a quote), or -1.
func skipString(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}

// skipValue returns the offset just past the value starting at b[i], or
// -1 when there is none.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				e := skipString(b, j)
				if e < 0 {
					return -1
				}
				j = e - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	default: // a number or a literal
		j := i
		for j < len(b) {
			c := b[j]
			if c == ',' || c == '}' || c == ']' || c == ' ' || c == '\t' || c == '\n' || c == '\r' {
				break
			}
			j++
		}
		if j == i {
			return -1
		}
		return j
	}
}

// eachField calls fn for every member of the object starting at b[i]
// (a brace) in order: key is the key's raw bytes between its quotes,
// b[start:end] the value. It stops early when fn returns false, and
// reports false on malformed input.
func eachField(b []byte, i int, fn func(key []byte, start, end int) bool) bool {
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return true
	}
	for i < len(b) {
		if b[i] != '"' {
			return false
		}
		ke := skipString(b, i)
		if ke < 0 {
			return false
		}
		key := b[i+1 : ke-1]
		i = skipWS(b, ke)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		vs := skipWS(b, i+1)
		ve := skipValue(b, vs)
		if ve < 0 {
			return false
		}
		if !fn(key, vs, ve) {
			return true
		}
		i = skipWS(b, ve)
		if i >= len(b) {
			return false
		}
		if b[i] == '}' {
			return true
		}
		if b[i] != ',' {
			return false
		}
		i = skipWS(b, i+1)
	}
	return false
}

// eachElement calls fn for every element b[start:end] of the array
// starting at b[i] (a bracket); false on malformed input.
func eachElement(b []byte, i int, fn func(start, end int) bool) bool {
	if i >= len(b) || b[i] != '[' {
		return false
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return true
	}
	for i < len(b) {
		ve := skipValue(b, i)
		if ve < 0 {
			return false
		}
		if !fn(i, ve) {
			return true
		}
		i = skipWS(b, ve)
		if i >= len(b) {
			return false
		}
		if b[i] == ']' {
			return true
		}
		if b[i] != ',' {
			return false
		}
		i = skipWS(b, i+1)
	}
	return false
}

// keyIs reports whether a raw key spells name; a key with escapes
// (rare: "mod\u0065l") is decoded, as the engines' parsers would.
func keyIs(raw []byte, name string) bool {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw) == name
	}
	var s string
	q := make([]byte, 0, len(raw)+2)
	q = append(append(append(q, '"'), raw...), '"')
	return json.Unmarshal(q, &s) == nil && s == name
}

// stringValue decodes the JSON string v (quotes included); ok is false
// when v is not a string. Invalid UTF-8 becomes U+FFFD, as encoding/json
// (and Python) decode it.
func stringValue(v []byte) (string, bool) {
	if len(v) < 2 || v[0] != '"' {
		return "", false
	}
	if in := v[1 : len(v)-1]; bytes.IndexByte(in, '\\') < 0 && utf8.Valid(in) {
		return string(in), true
	}
	var s string
	if json.Unmarshal(v, &s) != nil {
		return "", false
	}
	return s, true
}

// appendStringValue is stringValue appending to a builder's worth of
// bytes, so the common unescaped case copies once.
func appendStringValue(dst []byte, v []byte) ([]byte, bool) {
	if len(v) < 2 || v[0] != '"' {
		return dst, false
	}
	if in := v[1 : len(v)-1]; bytes.IndexByte(in, '\\') < 0 && utf8.Valid(in) {
		return append(dst, in...), true
	}
	s, ok := stringValue(v)
	return append(dst, s...), ok
}
