package kvindex

// The index's two hash tables, open-addressed with linear probing over flat
// arrays rather than Go maps. Why: a lookup probes one table per prompt
// block, up to 256 of them into a table of millions of blocks, so each probe
// is a cache miss; a flat array makes that one miss (the key and its
// holders share a 24-byte slot) and keeps the probe loop short enough that
// the CPU runs several blocks' misses at once. A Go map costs a few misses
// per probe (directory, table, control word, slot) behind a call. Ingest
// gains the same way and allocates only when a table grows.
//
// Deletion is by backward shift, so there are no tombstones and a table
// that shrinks stays fast. Keys are KV block hashes — the low 64 bits of a
// sha256 in production, but small integers in tests and fuzzing — so they
// are mixed (Fibonacci hashing) before use.

// minCap is the smallest table: a power of two, as every capacity is.
const minCap = 8

// mix spreads a block hash over the table: the high bits of a Fibonacci
// product, so sequential keys do not cluster.
func mix(h uint64, shift uint8) uint64 { return (h * 0x9e3779b97f4a7c15) >> shift }

// shiftFor returns the shift that maps mix onto capacity c (a power of two).
func shiftFor(c int) uint8 {
	s := uint8(64)
	for ; c > 1; c >>= 1 {
		s--
	}
	return s
}

// holderSlot is one block's entry: its hash and its holders inline
// (holders.n == 0 marks an empty slot).
type holderSlot struct {
	key uint64
	holders
}

// blockTable maps a block hash to its holder set. Not safe for concurrent
// use; the Index's lock guards it. Max load 3/4: lookups of a block nobody
// holds end a prompt's walk, and at 3/4 they probe a few slots.
type blockTable struct {
	slots []holderSlot
	n     int
	shift uint8
}

func (t *blockTable) init(c int) {
	t.slots = make([]holderSlot, c)
	t.n = 0
	t.shift = shiftFor(c)
}

// find returns the slot index of h, or -1.
func (t *blockTable) find(h uint64) int {
	if len(t.slots) == 0 {
		return -1
	}
	mask := len(t.slots) - 1
	for i := int(mix(h, t.shift)); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.n == 0 {
			return -1
		}
		if s.key == h {
			return i
		}
	}
}

// get returns h's holders (zero when none).
func (t *blockTable) get(h uint64) holders {
	if i := t.find(h); i >= 0 {
		return t.slots[i].holders
	}
	return holders{}
}

// slot returns the slot of h, claiming an empty one (key set, n == 0 — the
// caller must fill it before any other call) when h is absent.
func (t *blockTable) slot(h uint64) *holderSlot {
	if (t.n+1)*4 > len(t.slots)*3 {
		t.resize(max(minCap, 2*len(t.slots)))
	}
	mask := len(t.slots) - 1
	for i := int(mix(h, t.shift)); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.n == 0 {
			s.key = h
			t.n++
			return s
		}
		if s.key == h {
			return s
		}
	}
}

// del empties slot i, shifting back the entries after it that probed past
// it, and shrinks a table left at 1/16 full.
func (t *blockTable) del(i int) {
	mask := len(t.slots) - 1
	for j := (i + 1) & mask; t.slots[j].n != 0; j = (j + 1) & mask {
		home := int(mix(t.slots[j].key, t.shift))
		// Move j into the hole at i when its home is not in (i, j].
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = holderSlot{}
	t.n--
	if len(t.slots) > minCap && t.n*16 < len(t.slots) {
		t.resize(len(t.slots) / 2)
	}
}

func (t *blockTable) resize(c int) {
	old := t.slots
	t.init(c)
	mask := c - 1
	for _, s := range old {
		if s.n == 0 {
			continue
		}
		i := int(mix(s.key, t.shift))
		for t.slots[i].n != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = s
		t.n++
	}
}

// hashSet is one replica's set of block hashes. Zero is a valid hash, so
// it is kept beside the array (which uses 0 for empty). Max load 3/4.
type hashSet struct {
	keys    []uint64
	n       int // in keys
	hasZero bool
	shift   uint8
}

// Len is how many hashes the set holds.
func (s *hashSet) Len() int {
	if s.hasZero {
		return s.n + 1
	}
	return s.n
}

func (s *hashSet) has(h uint64) bool {
	if h == 0 {
		return s.hasZero
	}
	if len(s.keys) == 0 {
		return false
	}
	mask := len(s.keys) - 1
	for i := int(mix(h, s.shift)); ; i = (i + 1) & mask {
		switch s.keys[i] {
		case 0:
			return false
		case h:
			return true
		}
	}
}

// add inserts h and reports whether it was absent.
func (s *hashSet) add(h uint64) bool {
	if h == 0 {
		had := s.hasZero
		s.hasZero = true
		return !had
	}
	if (s.n+1)*4 > len(s.keys)*3 {
		s.resize(max(minCap, 2*len(s.keys)))
	}
	mask := len(s.keys) - 1
	for i := int(mix(h, s.shift)); ; i = (i + 1) & mask {
		switch s.keys[i] {
		case 0:
			s.keys[i] = h
			s.n++
			return true
		case h:
			return false
		}
	}
}

// remove deletes h and reports whether it was present.
func (s *hashSet) remove(h uint64) bool {
	if h == 0 {
		had := s.hasZero
		s.hasZero = false
		return had
	}
	if len(s.keys) == 0 {
		return false
	}
	mask := len(s.keys) - 1
	i := int(mix(h, s.shift))
	for ; s.keys[i] != h; i = (i + 1) & mask {
		if s.keys[i] == 0 {
			return false
		}
	}
	for j := (i + 1) & mask; s.keys[j] != 0; j = (j + 1) & mask {
		home := int(mix(s.keys[j], s.shift))
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			s.keys[i] = s.keys[j]
			i = j
		}
	}
	s.keys[i] = 0
	s.n--
	if len(s.keys) > minCap && s.n*16 < len(s.keys) {
		s.resize(len(s.keys) / 2)
	}
	return true
}

// each calls f for every hash, in table order; f must not change the set.
func (s *hashSet) each(f func(uint64)) {
	if s.hasZero {
		f(0)
	}
	for _, k := range s.keys {
		if k != 0 {
			f(k)
		}
	}
}

func (s *hashSet) resize(c int) {
	old := s.keys
	s.keys = make([]uint64, c)
	s.shift = shiftFor(c)
	mask := c - 1
	for _, k := range old {
		if k == 0 {
			continue
		}
		i := int(mix(k, s.shift))
		for s.keys[i] != 0 {
			i = (i + 1) & mask
		}
		s.keys[i] = k
	}
}
