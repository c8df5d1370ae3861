package server

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// fakeKeyring records the operations it is asked, refuses with err, and
// lists fps.
type fakeKeyring struct {
	calls []string
	key   []byte
	err   error
	fps   []string
}

func (k *fakeKeyring) do(op string, key []byte) error {
	k.calls = append(k.calls, op)
	k.key = key
	return k.err
}
func (k *fakeKeyring) Install(key []byte) error { return k.do("install", key) }
func (k *fakeKeyring) Use(key []byte) error     { return k.do("use", key) }
func (k *fakeKeyring) Remove(key []byte) error  { return k.do("remove", key) }
func (k *fakeKeyring) Fingerprints() []string   { return k.fps }

// TestLocalKeyring: each operation reaches the keyring with the decoded
// key and answers this server's keys after it (fingerprints, primary
// first); the keyring's refusal is the answer's error, not the call's; a
// request no server could run is INVALID_ARGUMENT and reaches nothing.
func TestLocalKeyring(t *testing.T) {
	key := bytes.Repeat([]byte{'k'}, 32)
	k64 := base64.StdEncoding.EncodeToString(key)
	refusal := errors.New("remove 1234: it is the primary key")
	tests := []struct {
		name    string
		req     *llmgwv1.KeyringRequest
		err     error
		code    codes.Code
		call    string // the keyring operation expected, "" for none
		errPart string // in the answer's error
	}{
		{"list", &llmgwv1.KeyringRequest{Op: llmgwv1.KeyringOp_KEYRING_OP_LIST}, nil, codes.OK, "", ""},
		{"install", &llmgwv1.KeyringRequest{Op: llmgwv1.KeyringOp_KEYRING_OP_INSTALL, Key: k64}, nil, codes.OK, "install", ""},
		{"use", &llmgwv1.KeyringRequest{Op: llmgwv1.KeyringOp_KEYRING_OP_USE, Key: k64}, nil, codes.OK, "use", ""},
		{"remove", &llmgwv1.KeyringRequest{Op: llmgwv1.KeyringOp_KEYRING_OP_REMOVE, Key: k64}, nil, codes.OK, "remove", ""},
		{"refused", &llmgwv1.KeyringRequest{Op: llmgwv1.KeyringOp_KEYRING_OP_REMOVE, Key: k64}, refusal, codes.OK, "remove", "primary key"},
		{"no op", &llmgwv1.KeyringRequest{}, nil, codes.InvalidArgument, "", ""},
		{"short key", &llmgwv1.KeyringRequest{Op: llmgwv1.KeyringOp_KEYRING_OP_INSTALL, Key: "AAAA"}, nil, codes.InvalidArgument, "", ""},
		{"key not base64", &llmgwv1.KeyringRequest{Op: llmgwv1.KeyringOp_KEYRING_OP_USE, Key: "*"}, nil, codes.InvalidArgument, "", ""},
		{"list with a key", &llmgwv1.KeyringRequest{Op: llmgwv1.KeyringOp_KEYRING_OP_LIST, Key: k64}, nil, codes.InvalidArgument, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kr := &fakeKeyring{err: tt.err, fps: []string{"aaaa", "bbbb"}}
			s := New(&fakeProposer{}, slog.New(slog.DiscardHandler)).WithKeyring("c1", kr)
			got, err := s.LocalKeyring(context.Background(), tt.req)
			if status.Code(err) != tt.code {
				t.Fatalf("err %v, want %s", err, tt.code)
			}
			var want []string
			if tt.call != "" {
				want = []string{tt.call}
			}
			if !slices.Equal(kr.calls, want) || tt.call != "" && !bytes.Equal(kr.key, key) {
				t.Fatalf("keyring asked %v with %q, want %v with the key", kr.calls, kr.key, want)
			}
			if tt.code != codes.OK {
				return
			}
			if got.ServerId != "c1" || (tt.errPart == "") != (got.Error == "") || !strings.Contains(got.Error, tt.errPart) {
				t.Fatalf("answer %v, want server c1 and error %q", got, tt.errPart)
			}
			if len(got.Keys) != 2 || got.Keys[0].Fingerprint != "aaaa" || !got.Keys[0].Primary || got.Keys[1].Fingerprint != "bbbb" || got.Keys[1].Primary {
				t.Fatalf("keys %v, want aaaa (primary), bbbb", got.Keys)
			}
		})
	}
}

func TestLocalKeyringWithoutKeyring(t *testing.T) {
	s := New(&fakeProposer{}, slog.New(slog.DiscardHandler)).WithKeyring("c1", nil)
	got, err := s.LocalKeyring(context.Background(), &llmgwv1.KeyringRequest{Op: llmgwv1.KeyringOp_KEYRING_OP_LIST})
	if err != nil || !strings.Contains(got.GetError(), "--gossip-key-file") {
		t.Fatalf("LocalKeyring = %v, %v; want an answer naming --gossip-key-file", got, err)
	}
}
