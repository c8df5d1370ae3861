package server

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
	key, err := KeyringRequestKey(req)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	out := &llmgwv1.ServerKeyring{ServerId: s.self}
	if s.keyring == nil {
		out.Error = errNoKeyring.Error()
		return out, nil
	}
	switch req.GetOp() {
	case llmgwv1.KeyringOp_KEYRING_OP_INSTALL:
		err = s.keyring.Install(key)
	case llmgwv1.KeyringOp_KEYRING_OP_USE:
		err = s.keyring.Use(key)
	case llmgwv1.KeyringOp_KEYRING_OP_REMOVE:
		err = s.keyring.Remove(key)
	}
	if err != nil {
		out.Error = err.Error()
		s.log.Warn("gossip keyring operation refused", "op", req.GetOp().String(), "err", err)
	} else if req.GetOp() != llmgwv1.KeyringOp_KEYRING_OP_LIST {
		s.log.Info("gossip keyring changed", "op", req.GetOp().String(), "keys", len(s.keyring.Fingerprints()))
	}
	for i, fp := range s.keyring.Fingerprints() {
		out.Keys = append(out.Keys, &llmgwv1.KeyringKey{Fingerprint: fp, Primary: i == 0})
	}
	return out, nil
}

// KeyringRequestKey checks a keyring request before any server runs it:
// a known operation, and a key (base64 of 16, 24 or 32 bytes) for every
// operation but LIST. It returns the decoded key (nil for LIST).
func KeyringRequestKey(req *llmgwv1.KeyringRequest) ([]byte, error) {
	switch req.GetOp() {
	case llmgwv1.KeyringOp_KEYRING_OP_LIST:
		if req.GetKey() != "" {
			return nil, errors.New("key: not taken by list")
		}
		return nil, nil
	case llmgwv1.KeyringOp_KEYRING_OP_INSTALL, llmgwv1.KeyringOp_KEYRING_OP_USE, llmgwv1.KeyringOp_KEYRING_OP_REMOVE:
	default:
		return nil, fmt.Errorf("op: %s is not list, install, use or remove", req.GetOp())
	}
	key, err := base64.StdEncoding.DecodeString(req.GetKey())
	if err != nil {
		return nil, fmt.Errorf("key: not base64: %w", err)
	}
	if n := len(key); n != 16 && n != 24 && n != 32 {
		return nil, fmt.Errorf("key: %d bytes, want 16, 24 or 32 (AES-128, -192, -256)", n)
	}
	return key, nil
}
