package service

import (
	"encoding/base64"
	"errors"
	"fmt"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// KeyringKey checks a keyring request before any server runs it:
// a known operation, and a key (base64 of 16, 24 or 32 bytes) for every
// operation but LIST. It returns the decoded key (nil for LIST).
func KeyringKey(req *llmgwv1.KeyringRequest) ([]byte, error) {
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
