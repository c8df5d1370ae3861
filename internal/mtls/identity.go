// Package mtls is how llmgw uses TLS (design §11): the roles and the
// identity a certificate carries, making a CA and role certificates
// (llmgwctl tls), loading them with renewal on disk picked up without a
// restart, and the tls.Config and gRPC credentials every listener and dialer
// uses.
//
// Why the identity lives in a URI SAN (llmgw://ROLE/NAME) and not in the
// subject: a URI SAN is one exact, typed value that verification already
// parses, while subject fields are free text that other tools fill in their
// own ways. The DNS SANs (ROLE.llmgw, NAME.ROLE.llmgw) are there so that a
// client can demand a role with Go's ordinary hostname check: dialing a
// control server expects "server.llmgw", whatever address it dialed.
package mtls

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// Role is what a certificate lets its holder do (design §11).
type Role string

const (
	// RoleServer is a control-plane server: it may join gossip and Raft
	// and call every service (servers forward to one another).
	RoleServer Role = "server"
	// RoleAgent is a node agent: it may attach only as the node named in
	// its certificate and report only that node's replicas.
	RoleAgent Role = "agent"
	// RoleRouter is a router: it may watch and subscribe, not administer.
	RoleRouter Role = "router"
	// RoleAdmin is an operator (llmgwctl): AdminService writes, snapshots
	// and Raft verbs.
	RoleAdmin Role = "admin"
	// RoleScraper is a monitoring system (Prometheus): it may read a
	// router's operations port — /metrics, /sd/replicas, the KV index's
	// summary — and nothing else anywhere. It exists so that a scraper
	// reaching routers across the network needs no admin certificate,
	// which would let whoever holds its key administer the cluster.
	RoleScraper Role = "scraper"
)

// Roles lists every role, in the order documentation shows them.
var Roles = []Role{RoleServer, RoleAgent, RoleRouter, RoleAdmin, RoleScraper}

// Valid reports whether r is one of Roles.
func (r Role) Valid() bool {
	for _, v := range Roles {
		if r == v {
			return true
		}
	}
	return false
}

// roleList is Roles as a comma-separated list, for messages.
func roleList() string {
	names := make([]string, len(Roles))
	for i, r := range Roles {
		names[i] = string(r)
	}
	return strings.Join(names, ", ")
}

// DNSName is the SAN every certificate of role r carries, and the name a
// client verifies when it dials a peer that must hold role r.
func (r Role) DNSName() string { return string(r) + ".llmgw" }

// Identity is who a verified peer is: its role and its name (a server's or
// agent's node id, a router's or admin's chosen name).
type Identity struct {
	Role Role
	Name string
}

func (i Identity) String() string { return string(i.Role) + "/" + i.Name }

// uriScheme is the scheme of the identity URI SAN: llmgw://ROLE/NAME.
const uriScheme = "llmgw"

// nameRE bounds names to what is safe in a DNS label chain, a file name and
// a log line: a node id such as "gpu-07" or "n1.rack2".
var nameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]{0,62}[A-Za-z0-9])?$`)

// Validate checks that i can be written into a certificate.
func (i Identity) Validate() error {
	if !i.Role.Valid() {
		return fmt.Errorf("role %q is not one of %s", i.Role, roleList())
	}
	if !nameRE.MatchString(i.Name) {
		return fmt.Errorf("name %q must be 1-64 letters, digits, '.', '-' or '_', starting and ending with a letter or digit", i.Name)
	}
	return nil
}

// URI is the identity's URI SAN.
func (i Identity) URI() *url.URL {
	return &url.URL{Scheme: uriScheme, Host: string(i.Role), Path: "/" + i.Name}
}

// ErrNoIdentity is returned for a certificate without an llmgw identity.
var ErrNoIdentity = errors.New("certificate carries no llmgw identity (URI SAN llmgw://ROLE/NAME)")

// IdentityOf reads the identity of a certificate that has already been
// verified against the CA. Exactly one llmgw URI SAN is accepted: two would
// make the holder's identity a matter of which one a reader picks.
func IdentityOf(cert *x509.Certificate) (Identity, error) {
	var found []Identity
	for _, u := range cert.URIs {
		if u.Scheme != uriScheme {
			continue
		}
		id := Identity{Role: Role(u.Host), Name: trimSlash(u.Path)}
		if err := id.Validate(); err != nil {
			return Identity{}, fmt.Errorf("certificate identity %s: %w", u, err)
		}
		found = append(found, id)
	}
	switch len(found) {
	case 0:
		return Identity{}, ErrNoIdentity
	case 1:
		return found[0], nil
	default:
		return Identity{}, fmt.Errorf("certificate carries %d llmgw identities; exactly one is allowed", len(found))
	}
}

func trimSlash(p string) string {
	if len(p) > 0 && p[0] == '/' {
		return p[1:]
	}
	return p
}

// FromContext is the identity of a gRPC call's peer, verified by the
// handshake. ok is false on a plain-text connection (an --insecure
// deployment or a test), where nothing is known of the caller.
func FromContext(ctx context.Context) (Identity, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.AuthInfo == nil {
		return Identity{}, false
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return Identity{}, false
	}
	id, err := IdentityOf(info.State.VerifiedChains[0][0])
	if err != nil {
		return Identity{}, false
	}
	return id, true
}
