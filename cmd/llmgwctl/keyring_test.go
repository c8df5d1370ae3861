package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// fakeKeyring answers AdminService.Keyring with resp and records requests.
type fakeKeyring struct {
	llmgwv1.UnimplementedAdminServiceServer
	resp *llmgwv1.KeyringResponse

	mu   sync.Mutex
	reqs []*llmgwv1.KeyringRequest
}

func (f *fakeKeyring) Keyring(_ context.Context, r *llmgwv1.KeyringRequest) (*llmgwv1.KeyringResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs = append(f.reqs, r)
	return f.resp, nil
}

// TestKeyringCommands: each verb sends its operation and key; the table
// has a row per server key, the primary starred, and a server's error on
// its own row, which also makes the command fail naming that server; a bad
// key is refused before any call; generate prints a usable key.
func TestKeyringCommands(t *testing.T) {
	key := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("k", 32)))
	ok := &llmgwv1.KeyringResponse{Servers: []*llmgwv1.ServerKeyring{
		{ServerId: "c1", Keys: []*llmgwv1.KeyringKey{{Fingerprint: "aaaa", Primary: true}, {Fingerprint: "bbbb"}}},
		{ServerId: "c2", Keys: []*llmgwv1.KeyringKey{{Fingerprint: "aaaa", Primary: true}, {Fingerprint: "bbbb"}}},
	}}
	partial := &llmgwv1.KeyringResponse{Servers: []*llmgwv1.ServerKeyring{
		{ServerId: "c1", Keys: []*llmgwv1.KeyringKey{{Fingerprint: "aaaa", Primary: true}}},
		{ServerId: "c2", Error: "not alive in gossip"},
	}}
	tests := []struct {
		name    string
		args    []string
		resp    *llmgwv1.KeyringResponse
		op      llmgwv1.KeyringOp // of the request sent; unspecified: none sent
		out     []string          // lines (fields joined by one space) the output holds
		errPart string
	}{
		{"list", []string{"keyring", "list"}, ok, llmgwv1.KeyringOp_KEYRING_OP_LIST,
			[]string{"SERVER KEY PRIMARY ERROR", "c1 aaaa * -", "c1 bbbb - -", "c2 aaaa * -"}, ""},
		{"install", []string{"keyring", "install", key}, ok, llmgwv1.KeyringOp_KEYRING_OP_INSTALL, []string{"c2 bbbb - -"}, ""},
		{"use", []string{"keyring", "use", key}, ok, llmgwv1.KeyringOp_KEYRING_OP_USE, nil, ""},
		{"remove fails on one server", []string{"keyring", "remove", key}, partial, llmgwv1.KeyringOp_KEYRING_OP_REMOVE,
			[]string{"c1 aaaa * -", "c2 - - not alive in gossip"}, "failed on 1 of 2 servers: c2: not alive"},
		{"bad key", []string{"keyring", "install", "c2hvcnQ="}, ok, 0, nil, "keyring install: key of 5 bytes"},
		{"no key", []string{"keyring", "use"}, ok, 0, nil, "accepts 1 arg"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeKeyring{resp: tt.resp}
			out, err := run(serveAdmin(t, f), tt.args...)
			if (tt.errPart == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tt.errPart) {
				t.Fatalf("err %v, want %q", err, tt.errPart)
			}
			if tt.op == 0 {
				if len(f.reqs) != 0 {
					t.Fatalf("sent %v despite the refusal", f.reqs)
				}
				return
			}
			if len(f.reqs) != 1 || f.reqs[0].Op != tt.op || (tt.op != llmgwv1.KeyringOp_KEYRING_OP_LIST && f.reqs[0].Key != key) {
				t.Fatalf("sent %v, want one %s with the key", f.reqs, tt.op)
			}
			var lines []string
			for _, l := range strings.Split(out, "\n") {
				lines = append(lines, strings.Join(strings.Fields(l), " "))
			}
			for _, want := range tt.out {
				if !containsLine(lines, want) {
					t.Fatalf("output lacks %q:\n%s", want, out)
				}
			}
		})
	}
}

func containsLine(lines []string, want string) bool {
	for _, l := range lines {
		if l == want {
			return true
		}
	}
	return false
}

func TestKeyringJSONAndGenerate(t *testing.T) {
	f := &fakeKeyring{resp: &llmgwv1.KeyringResponse{Servers: []*llmgwv1.ServerKeyring{
		{ServerId: "c1", Keys: []*llmgwv1.KeyringKey{{Fingerprint: "aaaa", Primary: true}}},
	}}}
	out, err := run(serveAdmin(t, f), "keyring", "list", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var v []struct {
		ServerID string `json:"server_id"`
		Keys     []struct {
			Fingerprint string `json:"fingerprint"`
			Primary     bool   `json:"primary"`
		} `json:"keys"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil || len(v) != 1 || v[0].ServerID != "c1" || v[0].Keys[0].Fingerprint != "aaaa" || !v[0].Keys[0].Primary {
		t.Fatalf("json %s: %+v, %v", out, v, err)
	}
	gen, err := run("127.0.0.1:1", "keyring", "generate")
	if err != nil {
		t.Fatal(err)
	}
	k, err := base64.StdEncoding.DecodeString(strings.TrimSpace(gen))
	if err != nil || len(k) != 32 {
		t.Fatalf("generate printed %q: %d bytes, %v; want a 32-byte base64 key", gen, len(k), err)
	}
}
