package scheduler

import "github.com/llmgw/llmgw/router/prefix"

// Rendezvous returns the candidate that highest-random-weight hashing
// chooses for key among those eligible accepts (nil: all), or -1. It
// depends only on the key and the candidates' IDs and UIDs, which every
// router sees alike, so routers that have never talked place an unseen
// session or prefix on the same replica (design §7.3); removing a replica
// moves only the keys that were on it.
func Rendezvous(key uint64, cands []Candidate, eligible func(*Candidate) bool) int {
	best, bestH := -1, uint64(0)
	for i := range cands {
		c := &cands[i]
		if eligible != nil && !eligible(c) {
			continue
		}
		if h := rank(key, c); best < 0 || h > bestH {
			best, bestH = i, h
		}
	}
	return best
}

// rank is c's highest-random-weight hash for key.
func rank(key uint64, c *Candidate) uint64 {
	return prefix.Mix(key ^ hashString(c.Key.ID) ^ prefix.Mix(c.Key.UID))
}

func hashString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// indexOf is the position of the candidate with key k, or -1.
func indexOf(cands []Candidate, k Key) int {
	for i := range cands {
		if cands[i].Key == k {
			return i
		}
	}
	return -1
}
