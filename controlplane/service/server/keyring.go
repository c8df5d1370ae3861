package server

import (
	"context"
	"errors"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/controlplane/service"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Keyring is this server's gossip encryption keyring (package gossip,
// design §11). Install and Remove of a key already in (or out) are no-ops;
// Remove refuses the primary; Use refuses a key not installed.
type Keyring interface {
	Install(key []byte) error
	Use(key []byte) error
	Remove(key []byte) error
	// Fingerprints lists the installed keys' fingerprints, the primary
	// first: never the keys.
	Fingerprints() []string
}

// errNoKeyring is the answer of a server whose gossip is not encrypted.
var errNoKeyring = errors.New("gossip encryption is off on this server: start it with --gossip-key-file to use a keyring")

// WithKeyring makes s answer LocalKeyring for server self with k (nil: a
// server whose gossip is unencrypted, which says so). Call it before
// serving.
func (s *Service) WithKeyring(self string, k Keyring) *Service {
	s.self, s.keyring = self, k
	return s
}

// LocalKeyring runs one keyring operation on this server only, persisted
// before it answers (package gossip). Why an operation failed here is the
// answer's error, not the call's: the caller, fanning out to every server
// (AdminService.Keyring), reports each server's outcome on its own line.
// The call fails only for a request no server could run.
func (s *Service) LocalKeyring(_ context.Context, req *llmgwv1.KeyringRequest) (*llmgwv1.ServerKeyring, error) {
	key, err := service.KeyringKey(req)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	out := &llmgwv1.ServerKeyring{ServerId: s.self}
	if s.keyring == nil {
		out.Error = errNoKeyring.Error()
		return out, nil
	}
	before := s.keyring.Fingerprints()
	switch req.GetOp() {
	case llmgwv1.KeyringOp_KEYRING_OP_INSTALL:
		err = s.keyring.Install(key)
	case llmgwv1.KeyringOp_KEYRING_OP_USE:
		err = s.keyring.Use(key)
	case llmgwv1.KeyringOp_KEYRING_OP_REMOVE:
		err = s.keyring.Remove(key)
	}
	after := s.keyring.Fingerprints()
	if err != nil {
		out.Error = err.Error()
		s.log.Warn("gossip keyring operation refused", "op", req.GetOp().String(), "err", err)
	} else if !slices.Equal(before, after) {
		s.log.Info("gossip keyring changed", "op", req.GetOp().String(), "keys", after)
	}
	for i, fp := range after {
		out.Keys = append(out.Keys, &llmgwv1.KeyringKey{Fingerprint: fp, Primary: i == 0})
	}
	return out, nil
}
