package cluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"time"

	"github.com/llmgw/llmgw/controlplane/gossip"
	"github.com/llmgw/llmgw/internal/mtls"
)

// verifyTimeout bounds one verification: a member that does not complete
// a handshake in this long stays out until the next reconcile.
const verifyTimeout = time.Second

// VerifyServer proves that the server named id answers at raftAddr: a
// nil error only when it does (design §11).
type VerifyServer func(ctx context.Context, id, raftAddr string) error

// VerifyByTLS is the check of a TLS cluster: a mutual-TLS handshake with
// the member's Raft transport (the address the configuration would hold),
// whose certificate must chain to the CA, be a server's and be named id.
// Gossip membership alone proves nothing: whoever reaches the gossip port
// could claim any id, and a server added to Raft receives every model.
func VerifyByTLS(src *mtls.Source) VerifyServer {
	return func(ctx context.Context, id, raftAddr string) error {
		d := &tls.Dialer{NetDialer: &net.Dialer{}, Config: src.ClientConfig(mtls.RoleServer)}
		c, err := d.DialContext(ctx, "tcp", raftAddr)
		if err != nil {
			return fmt.Errorf("server %s: no mutual-TLS handshake with its raft address %s: %w", id, raftAddr, err)
		}
		defer c.Close()
		certs := c.(*tls.Conn).ConnectionState().PeerCertificates
		if len(certs) == 0 {
			return fmt.Errorf("server %s at %s sent no certificate", id, raftAddr)
		}
		got, err := mtls.IdentityOf(certs[0])
		if err != nil {
			return fmt.Errorf("server %s at %s: %w", id, raftAddr, err)
		}
		if got.Role != mtls.RoleServer || got.Name != id {
			return fmt.Errorf("the certificate at %s is %s; expected server/%s", raftAddr, got, id)
		}
		return nil
	}
}

// certified reports whether gossip member m may be added to Raft or
// bootstrapped with: always without Config.Verify; with it, once m's
// certificate was verified at its current Raft address. A refusal is
// logged once per (member, reason) in reported and counted (Unverified).
func (c *Cluster) certified(ctx context.Context, m gossip.Member, reported map[string]bool) bool {
	if c.cfg.Verify == nil {
		return true
	}
	id, addr := m.Meta.ID, m.Meta.Raft
	c.certifiedMu.Lock()
	ok := c.certifiedAt[id] == addr && addr != ""
	c.certifiedMu.Unlock()
	if ok {
		return true
	}
	vctx, cancel := context.WithTimeout(ctx, verifyTimeout)
	defer cancel()
	if err := c.cfg.Verify(vctx, id, addr); err != nil {
		c.unverified.Add(1)
		c.certifiedMu.Lock()
		c.notCertified[id] = "server certificate not verified: " + err.Error()
		c.certifiedMu.Unlock()
		if key := "unverified/" + id + "/" + err.Error(); !reported[key] {
			reported[key] = true
			c.log.Error("server not verified: kept out of raft", "member", id, "raft_addr", addr, "err", err)
		}
		return false
	}
	c.certifiedMu.Lock()
	c.certifiedAt[id] = addr
	delete(c.notCertified, id)
	c.certifiedMu.Unlock()
	c.log.Info("server certificate verified", "member", id, "raft_addr", addr)
	return true
}

// Unverified is how many verifications of gossip members have failed
// (llmgw_control_servers_unverified_total): each is a member that claimed
// to be a server and was kept out of Raft.
func (c *Cluster) Unverified() uint64 { return c.unverified.Load() }

// notCertifiedReason is why the last verification of member id failed, ""
// when none did (or it was verified since).
func (c *Cluster) notCertifiedReason(id string) string {
	c.certifiedMu.Lock()
	defer c.certifiedMu.Unlock()
	return c.notCertified[id]
}
