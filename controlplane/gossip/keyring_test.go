package gossip

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// testKey is key number i, of n bytes.
func testKey(i byte, n int) []byte { return bytes.Repeat([]byte{i}, n) }

func b64(k []byte) string { return base64.StdEncoding.EncodeToString(k) }

func writeKeyFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "gossip.key")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDecodeKey(t *testing.T) {
	tests := []struct {
		name, in string
		want     []byte
		err      string
	}{
		{"aes-128", b64(testKey(1, 16)), testKey(1, 16), ""},
		{"aes-192", b64(testKey(1, 24)), testKey(1, 24), ""},
		{"aes-256 with a newline", b64(testKey(1, 32)) + "\n", testKey(1, 32), ""},
		{"empty", "  \n", nil, "no key"},
		{"not base64", "not*base64", nil, "not base64"},
		{"wrong size", b64(testKey(1, 20)), nil, "20 bytes"},
		{"two keys", b64(testKey(1, 16)) + "\n" + b64(testKey(2, 16)), nil, "not base64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeKey(tt.in)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("DecodeKey = %v, want an error containing %q", err, tt.err)
				}
				return
			}
			if err != nil || !bytes.Equal(got, tt.want) {
				t.Fatalf("DecodeKey = %x, %v; want %x", got, err, tt.want)
			}
		})
	}
}

func TestGenerateKey(t *testing.T) {
	a, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := GenerateKey()
	k, err := DecodeKey(a)
	if err != nil || len(k) != 32 {
		t.Fatalf("generated %q: %d bytes, %v; want a 32-byte key", a, len(k), err)
	}
	if a == b {
		t.Fatal("two generated keys are equal")
	}
}

func TestFingerprint(t *testing.T) {
	fp := Fingerprint(testKey(1, 32))
	if len(fp) != 16 || fp == Fingerprint(testKey(2, 32)) {
		t.Fatalf("fingerprint %q: want 16 hex digits, distinct per key", fp)
	}
	if strings.Contains(fp, b64(testKey(1, 32))[:8]) {
		t.Fatal("the fingerprint shows the key")
	}
}

// persisted reads DATA/gossip.keyring as the list of keys it holds.
func persisted(t *testing.T, dataDir string) []string {
	t.Helper()
	p := filepath.Join(dataDir, KeyringFile)
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s has mode %v, want 0600", p, fi.Mode().Perm())
	}
	b, _ := os.ReadFile(p)
	var list []string
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	return list
}

// TestOpenKeyring: the key file starts a keyring, persisted at once; the
// persisted keyring wins over the key file on the next start; no file and
// no flag is no encryption; a persisted keyring without the flag, and bad
// files, are refused naming what is wrong.
func TestOpenKeyring(t *testing.T) {
	k1, k2 := testKey(1, 32), testKey(2, 16)
	t.Run("key file, then persisted wins", func(t *testing.T) {
		data := t.TempDir()
		kr, err := OpenKeyring(data, writeKeyFile(t, b64(k1)+"\n"))
		if err != nil {
			t.Fatal(err)
		}
		if got := kr.Fingerprints(); !slices.Equal(got, []string{Fingerprint(k1)}) {
			t.Fatalf("keys %v", got)
		}
		if got := persisted(t, data); !slices.Equal(got, []string{b64(k1)}) {
			t.Fatalf("persisted %v", got)
		}
		// Rotate to k2, then restart with the old key file: k2 is primary.
		for _, step := range []func([]byte) error{kr.Install, kr.Use} {
			if err := step(k2); err != nil {
				t.Fatal(err)
			}
		}
		if err := kr.Remove(k1); err != nil {
			t.Fatal(err)
		}
		again, err := OpenKeyring(data, writeKeyFile(t, b64(k1)))
		if err != nil {
			t.Fatal(err)
		}
		if got := again.Fingerprints(); !slices.Equal(got, []string{Fingerprint(k2)}) {
			t.Fatalf("after restart keys %v, want the rotated %s alone", got, Fingerprint(k2))
		}
		if !bytes.Equal(again.Memberlist().GetPrimaryKey(), k2) {
			t.Fatal("memberlist's primary is not the persisted one")
		}
	})
	t.Run("neither", func(t *testing.T) {
		kr, err := OpenKeyring(t.TempDir(), "")
		if kr != nil || err != nil {
			t.Fatalf("OpenKeyring = %v, %v; want no keyring", kr, err)
		}
	})
	refusals := []struct {
		name      string
		persisted string // "" writes no persisted file
		keyFile   string // "-" gives no --gossip-key-file
		want      string
	}{
		{"persisted without the flag", `["` + b64(k1) + `"]`, "-", "--gossip-key-file is not given"},
		{"missing key file", "", "/nonexistent/gossip.key", "--gossip-key-file"},
		{"bad key file", "", "short", "--gossip-key-file"},
		{"bad key file beside a persisted ring", `["` + b64(k1) + `"]`, "short", "--gossip-key-file"},
		{"persisted not JSON", `[`, b64(k1), KeyringFile},
		{"persisted empty", `[]`, b64(k1), "holds no key"},
		{"persisted bad key", `["AAAA"]`, b64(k1), "key 1"},
		{"persisted repeats a key", `["` + b64(k1) + `","` + b64(k1) + `"]`, b64(k1), "twice"},
	}
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			data := t.TempDir()
			if tt.persisted != "" {
				if err := os.WriteFile(filepath.Join(data, KeyringFile), []byte(tt.persisted), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			keyFile := ""
			switch tt.keyFile {
			case "-":
			case "/nonexistent/gossip.key":
				keyFile = tt.keyFile
			default:
				keyFile = writeKeyFile(t, tt.keyFile)
			}
			kr, err := OpenKeyring(data, keyFile)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("OpenKeyring = %v, %v; want an error containing %q", kr, err, tt.want)
			}
		})
	}
}

// TestKeyringOps: each operation's effect on the keys (primary first), on
// memberlist's keyring and on the persisted file, and its refusals.
func TestKeyringOps(t *testing.T) {
	k1, k2, k3 := testKey(1, 32), testKey(2, 32), testKey(3, 24)
	fp := func(ks ...[]byte) []string {
		var out []string
		for _, k := range ks {
			out = append(out, Fingerprint(k))
		}
		return out
	}
	type step struct {
		op  string
		key []byte
	}
	tests := []struct {
		name  string
		steps []step
		want  []string // fingerprints after the steps, primary first
		err   string   // of the last step
	}{
		{"install keeps the primary", []step{{"install", k2}}, fp(k1, k2), ""},
		{"install twice is a no-op", []step{{"install", k2}, {"install", k2}}, fp(k1, k2), ""},
		{"install a bad key", []step{{"install", []byte("short")}}, fp(k1), "5 bytes"},
		{"use an installed key", []step{{"install", k2}, {"use", k2}}, fp(k2, k1), ""},
		{"use the primary is a no-op", []step{{"use", k1}}, fp(k1), ""},
		{"use a key not installed", []step{{"use", k2}}, fp(k1), "not installed"},
		{"full rotation", []step{{"install", k2}, {"use", k2}, {"remove", k1}}, fp(k2), ""},
		{"remove the primary", []step{{"install", k2}, {"remove", k1}}, fp(k1, k2), "primary key"},
		{"remove a key not installed is a no-op", []step{{"remove", k3}}, fp(k1), ""},
		{"remove from the middle", []step{{"install", k2}, {"install", k3}, {"remove", k2}}, fp(k1, k3), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := t.TempDir()
			kr, err := OpenKeyring(data, writeKeyFile(t, b64(k1)))
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tt.steps {
				var err error
				switch s.op {
				case "install":
					err = kr.Install(s.key)
				case "use":
					err = kr.Use(s.key)
				case "remove":
					err = kr.Remove(s.key)
				}
				want := ""
				if i == len(tt.steps)-1 {
					want = tt.err
				}
				if (want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), want) {
					t.Fatalf("step %d (%s): %v, want error %q", i+1, s.op, err, want)
				}
			}
			if got := kr.Fingerprints(); !slices.Equal(got, tt.want) {
				t.Fatalf("keys %v, want %v", got, tt.want)
			}
			var ml []string
			for _, k := range kr.Memberlist().GetKeys() {
				ml = append(ml, Fingerprint(k))
			}
			if !slices.Equal(ml, tt.want) {
				t.Fatalf("memberlist's keys %v, want %v", ml, tt.want)
			}
			var disk []string
			for _, s := range persisted(t, data) {
				k, _ := DecodeKey(s)
				disk = append(disk, Fingerprint(k))
			}
			if !slices.Equal(disk, tt.want) {
				t.Fatalf("persisted %v, want %v", disk, tt.want)
			}
		})
	}
}

// TestKeyringFailedPersistChangesNothing: an operation whose write fails
// leaves memberlist's keyring as it was, so memory and disk never differ.
func TestKeyringFailedPersistChangesNothing(t *testing.T) {
	data := t.TempDir()
	kr, err := OpenKeyring(data, writeKeyFile(t, b64(testKey(1, 32))))
	if err != nil {
		t.Fatal(err)
	}
	kr.path = filepath.Join(data, "missing-dir", KeyringFile)
	if err := kr.Install(testKey(2, 32)); err == nil {
		t.Fatal("install persisted into a missing directory")
	}
	if got := kr.Fingerprints(); len(got) != 1 {
		t.Fatalf("keys %v after a failed install, want the one key", got)
	}
}

// FuzzDecodeKeyring: the persisted keyring is a file an operator may edit;
// decoding never panics, and what it accepts is valid memberlist keys,
// none repeated, that encode back to the same list.
func FuzzDecodeKeyring(f *testing.F) {
	f.Add([]byte(`["` + b64(testKey(1, 32)) + `","` + b64(testKey(2, 16)) + `"]`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`["AAAA"]`))
	f.Add([]byte(`{"k":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		keys, err := decodeKeyring(b)
		if err != nil {
			return
		}
		if len(keys) == 0 || len(keys) > maxKeys {
			t.Fatalf("accepted %d keys", len(keys))
		}
		again, err := decodeKeyring(encodeKeyring(keys))
		if err != nil || !equalKeys(again, keys) {
			t.Fatalf("round trip: %v, %v", again, err)
		}
		if _, err := newKeyring("", keys); err != nil {
			t.Fatalf("accepted keys memberlist refuses: %v", err)
		}
	})
}

// FuzzDecodeKey: a key file and an operator's argument are outside input.
func FuzzDecodeKey(f *testing.F) {
	f.Add(b64(testKey(1, 32)))
	f.Add("  " + b64(testKey(1, 16)) + "\n")
	f.Add("====")
	f.Fuzz(func(t *testing.T, s string) {
		k, err := DecodeKey(s)
		if err == nil && len(k) != 16 && len(k) != 24 && len(k) != 32 {
			t.Fatalf("accepted a key of %d bytes", len(k))
		}
	})
}
