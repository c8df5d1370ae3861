package fsm

import (
	"cmp"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Versions order servers for the minimum-version gate (design §4, §13.3).
// Release builds carry a semantic version (-ldflags -X main.version=v0.2.0);
// anything else is one of two special cases, decided here once so the gate,
// the join check and llmgwctl agree:
//
//   - "" is an unknown version (a server gossip has not described): it is
//     below every release, so it never opens a gate nor passes a join check.
//   - any other string that is not a semantic version ("dev", a bare commit
//     hash from `git describe --always`) is a development build of this tree:
//     it knows every command its tree knows, so it compares above every
//     release. Mixing dev builds with releases in one cluster is for
//     developers; operators run releases.
//
// `git describe` output after a tag ("v0.1.0-3-gabc1234", optionally
// "-dirty") counts as its tag: that build is newer than the tag but may not
// know what the next release introduces, so counting it higher could open a
// gate it cannot apply.

// Version is a parsed semantic version.
type Version struct {
	Major, Minor, Patch uint64
	// Pre is the pre-release ("rc.1" in v1.2.0-rc.1); it orders below the
	// release itself.
	Pre string
}

func (v Version) String() string {
	s := fmt.Sprintf("v%d.%d.%d", v.Major, v.Minor, v.Patch)
	if v.Pre != "" {
		s += "-" + v.Pre
	}
	return s
}

var (
	semverRE   = regexp.MustCompile(`^v?(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$`)
	describeRE = regexp.MustCompile(`-[0-9]+-g[0-9a-f]{4,40}(-dirty)?$|-dirty$`)
	// ErrNotSemver is a version string that is not a semantic version.
	ErrNotSemver = errors.New("not a semantic version (vMAJOR.MINOR.PATCH)")
)

// ParseVersion parses "v1.2.3", "1.2.3", "v1.2.3-rc.1" (build metadata
// after "+" is ignored) and `git describe` forms after a tag, which count as
// the tag. Anything else is ErrNotSemver.
func ParseVersion(s string) (Version, error) {
	base := describeRE.ReplaceAllString(s, "")
	m := semverRE.FindStringSubmatch(base)
	if m == nil {
		return Version{}, fmt.Errorf("version %q: %w", s, ErrNotSemver)
	}
	var v Version
	var err error
	for i, p := range []*uint64{&v.Major, &v.Minor, &v.Patch} {
		if *p, err = strconv.ParseUint(m[i+1], 10, 64); err != nil {
			return Version{}, fmt.Errorf("version %q: %w", s, ErrNotSemver)
		}
	}
	v.Pre = m[4]
	for _, id := range strings.Split(v.Pre, ".") {
		if v.Pre != "" && id == "" {
			return Version{}, fmt.Errorf("version %q: empty pre-release identifier: %w", s, ErrNotSemver)
		}
	}
	return v, nil
}

// Compare orders two parsed versions as semver does: -1, 0 or +1.
func (v Version) Compare(o Version) int {
	if c := cmp.Compare(v.Major, o.Major); c != 0 {
		return c
	}
	if c := cmp.Compare(v.Minor, o.Minor); c != 0 {
		return c
	}
	if c := cmp.Compare(v.Patch, o.Patch); c != 0 {
		return c
	}
	return comparePre(v.Pre, o.Pre)
}

// comparePre is semver's pre-release order: none above any; identifiers
// compared left to right, numbers numerically and below words; a longer
// list above its prefix.
func comparePre(a, b string) int {
	switch {
	case a == b:
		return 0
	case a == "":
		return 1
	case b == "":
		return -1
	}
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) && i < len(bs); i++ {
		an, aerr := strconv.ParseUint(as[i], 10, 64)
		bn, berr := strconv.ParseUint(bs[i], 10, 64)
		var c int
		switch {
		case aerr == nil && berr == nil:
			c = cmp.Compare(an, bn)
		case aerr == nil:
			c = -1
		case berr == nil:
			c = 1
		default:
			c = strings.Compare(as[i], bs[i])
		}
		if c != 0 {
			return c
		}
	}
	return cmp.Compare(len(as), len(bs))
}

// IsDevVersion reports whether s is a development build: not empty and not
// a semantic version.
func IsDevVersion(s string) bool {
	if s == "" {
		return false
	}
	_, err := ParseVersion(s)
	return err != nil
}

// CompareVersions orders version strings for the gate: "" (unknown) below
// everything, releases by semver, development builds above every release
// and equal to each other.
func CompareVersions(a, b string) int {
	rank := func(s string) (int, Version) {
		if s == "" {
			return 0, Version{}
		}
		v, err := ParseVersion(s)
		if err != nil {
			return 2, Version{}
		}
		return 1, v
	}
	ra, va := rank(a)
	rb, vb := rank(b)
	if ra != rb || ra != 1 {
		return cmp.Compare(ra, rb)
	}
	return va.Compare(vb)
}

// AtLeast reports whether version have meets the minimum want; an empty
// want is no minimum.
func AtLeast(have, want string) bool {
	return want == "" || CompareVersions(have, want) >= 0
}
