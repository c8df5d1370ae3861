package addrs

import (
	"slices"
	"testing"
)

func TestMerge(t *testing.T) {
	tests := []struct {
		name  string
		lists [][]string
		want  []string
	}{
		{"learned first, then configured", [][]string{{"b", "c"}, {"a", "b"}}, []string{"b", "c", "a"}},
		{"empties and duplicates dropped", [][]string{{"", "a", "a"}, {""}}, []string{"a"}},
		{"nothing", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Merge(tt.lists...); !slices.Equal(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestRing(t *testing.T) {
	var r Ring
	list := []string{"a", "b", "c"}
	var got []string
	for range 4 {
		got = append(got, r.Next(list))
	}
	if want := []string{"a", "b", "c", "a"}; !slices.Equal(got, want) {
		t.Fatalf("rotation %v, want %v", got, want)
	}
	// The list shrinks under the ring: it stays in range.
	if a := r.Next([]string{"x"}); a != "x" {
		t.Fatalf("after shrinking got %q, want x", a)
	}
	if a := r.Next(nil); a != "" {
		t.Fatalf("empty list gave %q", a)
	}
	r.StartAfter(list, "b")
	if a := r.Next(list); a != "c" {
		t.Fatalf("StartAfter(b) then Next = %q, want c", a)
	}
	r.StartAfter(list, "c")
	if a := r.Next(list); a != "a" {
		t.Fatalf("StartAfter(last) then Next = %q, want a (wraps)", a)
	}
	r.StartAfter(list, "zz")
	if a := r.Next(list); a != "a" {
		t.Fatalf("StartAfter(unknown) then Next = %q, want a", a)
	}
}
