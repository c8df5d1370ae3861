// Package hostcheck is the one statement of which hosts an external
// engine's endpoints may not name (design §4 "Policy", §6 "External
// engines"): link-local addresses and cloud metadata services, where a
// request reads the node's instance credentials.
//
// It is a leaf shared by two judges that must agree: fsm, which checks a
// model's endpoints as written when it is applied, and the agent, which
// checks the addresses a name resolves to each time it connects — a name
// that passed at apply may resolve elsewhere later (DNS rebinding, or a
// record changed after the fact). It only parses strings (net/netip), so
// fsm stays off the network and deterministic.
package hostcheck

import (
	"fmt"
	"net/netip"
	"strings"
)

// metadataHosts are the names and addresses of cloud metadata services that
// are not link-local: a request there reads the node's instance credentials.
// (The link-local ones, 169.254.169.254 and fe80::a9fe:a9fe, are refused as
// link-local.)
var metadataHosts = map[string]string{
	"metadata.google.internal":   "the GCE metadata service",
	"metadata.goog":              "the GCE metadata service",
	"metadata":                   "the GCE metadata service (through the node's search domain)",
	"instance-data":              "the EC2 metadata service (through the node's search domain)",
	"instance-data.ec2.internal": "the EC2 metadata service",
	"fd00:ec2::254":              "the EC2 metadata service (IPv6)",
	"100.100.100.200":            "the Alibaba Cloud metadata service",
}

// Host says why host (as url.URL.Hostname returns it: no brackets, no port)
// is one an external endpoint may not name without
// allow_link_local_endpoints, or "". A name is judged as written; nothing is
// resolved (the agent checks what it resolves to with Addr).
func Host(host string) string {
	h := strings.TrimSuffix(strings.ToLower(host), ".")
	if why, ok := metadataHosts[h]; ok {
		return why
	}
	if a, err := netip.ParseAddr(h); err == nil {
		return Addr(a)
	}
	// A name whose last label is a number is no DNS name but another
	// spelling of an IPv4 address ("2852039166", "0xa9fea9fe",
	// "169.254.43518"), which some resolvers accept; only the dotted quad is
	// judged above, so the others are refused.
	labels := strings.Split(h, ".")
	last := labels[len(labels)-1]
	if last != "" && (strings.Trim(last, "0123456789") == "" || strings.HasPrefix(last, "0x")) {
		return "not a dotted-quad IPv4 address but names one"
	}
	return ""
}

// Addr says why an address — one written in a model, or one a name resolved
// to — is one an external endpoint may not reach without
// allow_link_local_endpoints, or "". An IPv4-mapped IPv6 address is judged
// as the IPv4 address it carries, and a zone is ignored.
func Addr(a netip.Addr) string {
	a = a.Unmap().WithZone("")
	if why, ok := metadataHosts[a.String()]; ok {
		return why
	}
	if a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() {
		return "a link-local address, where cloud metadata services answer"
	}
	return ""
}

// ParseAllow reads one entry of an allow-list of source addresses (a
// model's kv_events_allow: who may connect to the agent's socket for an
// external engine's publisher): an address, taken as a prefix of its full
// length, or a CIDR prefix in its canonical form. fsm checks the entries
// when a model is applied, the agent reads them when it binds.
func ParseAllow(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		if p != p.Masked() {
			return netip.Prefix{}, fmt.Errorf("%q has host bits set; write %s", s, p.Masked())
		}
		return p, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("must be an address or a CIDR prefix, got %q", s)
	}
	return netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), nil
}
