package fsm

// ValidClusterID reports whether s has the form of a cluster identity
// (design §5.2 "Cluster identity"): 32 lowercase hex digits, 128 random
// bits written by the first leader. The form is checked wherever an
// identity arrives from outside — the log, a data dir, a peer's gossip
// metadata or handshake — so a malformed one is refused by name rather
// than compared.
func ValidClusterID(s string) bool {
	if len(s) != 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
