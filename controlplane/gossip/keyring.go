package gossip

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/hashicorp/memberlist"

	"github.com/llmgw/llmgw/internal/atomicfile"
)

// KeyringFile is the name of the persisted keyring in a server's data
// directory (Consul's local.keyring is the model).
const KeyringFile = "gossip.keyring"

// maxKeyFile bounds what is read of a key file or a persisted keyring:
// both are small, and a wrong path (a log, a device) must not be read whole.
const maxKeyFile = 64 << 10

// maxKeys bounds the keys a persisted keyring may hold: a rotation needs
// two, and every key costs a decryption attempt per message that fails the
// primary.
const maxKeys = 16

// Keyring is a server's gossip encryption keyring (design §11): the keys
// memberlist decrypts with, the first (the primary) being the one it
// encrypts with. Operations change memberlist's own keyring in place, so
// they take effect on the next message, and are persisted first, in the
// data directory, so a server restarted after a rotation comes back with
// the keys the cluster now uses, whatever its key file says.
//
// Rotation without downtime is install (every server can decrypt the new
// key), use (every server encrypts with it; the others still decrypt it),
// remove the old key. Each step must have reached every server before the
// next one starts, which is why the admin call reports each server's answer.
type Keyring struct {
	path string

	mu   sync.Mutex // serialises operations and their persistence
	ring *memberlist.Keyring
}

// GenerateKey is a fresh random 32-byte (AES-256) key, base64 as a key file
// holds it (`llmgwctl keyring generate`, like `consul keygen`).
func GenerateKey() (string, error) {
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return "", fmt.Errorf("generate gossip key: %w", err)
	}
	return base64.StdEncoding.EncodeToString(k), nil
}

// DecodeKey reads one key as a key file or an operator writes it: base64
// (standard alphabet, padded) of 16, 24 or 32 bytes, surrounding space
// ignored. Outside input: a bad one is an error, never a crash.
func DecodeKey(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, errors.New("no key: want base64 of 16, 24 or 32 bytes (llmgwctl keyring generate makes one)")
	}
	k, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("key is not base64: %w", err)
	}
	if err := memberlist.ValidateKey(k); err != nil {
		return nil, fmt.Errorf("key of %d bytes: %w", len(k), err)
	}
	return k, nil
}

// ReadKeyFile reads a --gossip-key-file: one base64 key.
func ReadKeyFile(path string) ([]byte, error) {
	b, err := readSmall(path)
	if err != nil {
		return nil, err
	}
	k, err := DecodeKey(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

// Fingerprint is how a key is shown (llmgwctl keyring list): the first 8
// bytes of its SHA-256, hex. Never the key: a listing is safe to paste.
func Fingerprint(key []byte) string {
	sum := sha256.Sum256(key)
	return hex.EncodeToString(sum[:8])
}

// decodeKeyring reads a persisted keyring: a JSON list of base64 keys, the
// primary first, none repeated. Outside input (a file an operator may
// edit): a bad one is an error, never a crash.
func decodeKeyring(b []byte) ([][]byte, error) {
	var list []string
	if err := json.Unmarshal(b, &list); err != nil {
		return nil, fmt.Errorf("not a JSON list of base64 keys: %w", err)
	}
	if len(list) == 0 {
		return nil, errors.New("holds no key")
	}
	if len(list) > maxKeys {
		return nil, fmt.Errorf("holds %d keys, more than %d", len(list), maxKeys)
	}
	keys := make([][]byte, 0, len(list))
	for i, s := range list {
		k, err := DecodeKey(s)
		if err != nil {
			return nil, fmt.Errorf("key %d: %w", i+1, err)
		}
		for _, o := range keys {
			if bytes.Equal(o, k) {
				return nil, fmt.Errorf("key %d (%s) appears twice", i+1, Fingerprint(k))
			}
		}
		keys = append(keys, k)
	}
	return keys, nil
}

func encodeKeyring(keys [][]byte) []byte {
	list := make([]string, len(keys))
	for i, k := range keys {
		list[i] = base64.StdEncoding.EncodeToString(k)
	}
	b, _ := json.Marshal(list)
	return append(b, '\n')
}

// OpenKeyring is the keyring of a server whose data directory is dataDir,
// started with keyFile (--gossip-key-file, "" when not given):
//   - dataDir/gossip.keyring, when it exists, wins: it is what the last
//     operations left, and a rotated cluster restarts with its current keys;
//   - else the key file's key, persisted at once;
//   - neither: nil, and gossip runs unencrypted.
//
// A persisted keyring without a key file is refused rather than ignored or
// silently used: dropping the flag must neither turn encryption off (the
// server could not talk to the others) nor leave it on unseen.
func OpenKeyring(dataDir, keyFile string) (*Keyring, error) {
	path := filepath.Join(dataDir, KeyringFile)
	b, err := readSmall(path)
	switch {
	case err == nil:
		if keyFile == "" {
			return nil, fmt.Errorf("%s holds gossip keys but --gossip-key-file is not given: give it (the persisted keys win over it) or remove the file to run gossip unencrypted", path)
		}
		keys, err := decodeKeyring(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		// The key file is still read, so a broken one is found now and not
		// at the restart that needs it.
		if _, err := ReadKeyFile(keyFile); err != nil {
			return nil, fmt.Errorf("--gossip-key-file: %w", err)
		}
		return newKeyring(path, keys)
	case !errors.Is(err, os.ErrNotExist):
		return nil, err
	case keyFile == "":
		return nil, nil
	}
	k, err := ReadKeyFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("--gossip-key-file: %w", err)
	}
	if err := writeKeyring(path, [][]byte{k}); err != nil {
		return nil, err
	}
	return newKeyring(path, [][]byte{k})
}

func newKeyring(path string, keys [][]byte) (*Keyring, error) {
	ring, err := memberlist.NewKeyring(keys[1:], keys[0])
	if err != nil {
		return nil, fmt.Errorf("gossip keyring: %w", err)
	}
	return &Keyring{path: path, ring: ring}, nil
}

// Memberlist is the keyring memberlist encrypts and decrypts with.
func (k *Keyring) Memberlist() *memberlist.Keyring { return k.ring }

// Fingerprints lists the installed keys' fingerprints, the primary first.
func (k *Keyring) Fingerprints() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for _, key := range k.ring.GetKeys() {
		out = append(out, Fingerprint(key))
	}
	return out
}

// Install adds key (decrypting with it from now on); gossip keeps
// encrypting with the primary. Installing a key already there is a no-op,
// so a step retried after a partial failure is safe.
func (k *Keyring) Install(key []byte) error {
	return k.change(func(keys [][]byte) ([][]byte, error) {
		if err := memberlist.ValidateKey(key); err != nil {
			return nil, fmt.Errorf("install: key of %d bytes: %w", len(key), err)
		}
		if index(keys, key) >= 0 {
			return keys, nil
		}
		if len(keys) >= maxKeys {
			return nil, fmt.Errorf("install: the keyring already holds %d keys; remove one first", len(keys))
		}
		return append(keys, key), nil
	}, func() error { return k.ring.AddKey(key) })
}

// Use makes an installed key the primary, the one gossip encrypts with.
// Every server must have it installed first, or they stop understanding
// this one.
func (k *Keyring) Use(key []byte) error {
	return k.change(func(keys [][]byte) ([][]byte, error) {
		i := index(keys, key)
		if i < 0 {
			return nil, fmt.Errorf("use %s: the key is not installed (install it on every server first)", Fingerprint(key))
		}
		out := [][]byte{key}
		out = append(out, keys[:i]...)
		return append(out, keys[i+1:]...), nil
	}, func() error { return k.ring.UseKey(key) })
}

// Remove drops a key that is not the primary; removing one not installed
// is a no-op, so a step retried after a partial failure is safe.
//
// memberlist's RemoveKey shifts the keys after the removed one in place,
// under the slice a message being decrypted may be reading: removing the
// last key (the old one at the end of a rotation: [new, old]) writes
// nothing shared; removing one from the middle of three or more may make
// a message in flight at that instant fail to decrypt.
func (k *Keyring) Remove(key []byte) error {
	return k.change(func(keys [][]byte) ([][]byte, error) {
		i := index(keys, key)
		switch {
		case i == 0:
			return nil, fmt.Errorf("remove %s: it is the primary key, the one gossip encrypts with; make another key primary first (keyring use)", Fingerprint(key))
		case i < 0:
			return keys, nil
		}
		out := append([][]byte(nil), keys[:i]...)
		return append(out, keys[i+1:]...), nil
	}, func() error { return k.ring.RemoveKey(key) })
}

// change computes the new key list, persists it, then applies it to
// memberlist's keyring: a failed write leaves both as they were.
func (k *Keyring) change(next func([][]byte) ([][]byte, error), apply func() error) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	cur := append([][]byte(nil), k.ring.GetKeys()...)
	keys, err := next(cur)
	if err != nil {
		return err
	}
	if equalKeys(keys, cur) {
		return nil
	}
	if err := writeKeyring(k.path, keys); err != nil {
		return err
	}
	return apply()
}

func index(keys [][]byte, key []byte) int {
	for i, k := range keys {
		if bytes.Equal(k, key) {
			return i
		}
	}
	return -1
}

func equalKeys(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

func readSmall(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > maxKeyFile {
		return nil, fmt.Errorf("%s is over %d bytes: not a key file", path, maxKeyFile)
	}
	return b, nil
}

// writeKeyring persists keys at path (0600: it holds the keys themselves)
// through internal/atomicfile, so a crash leaves the old keyring or the new
// one, never half of one.
func writeKeyring(path string, keys [][]byte) error {
	if err := atomicfile.Write(path, encodeKeyring(keys), 0o600); err != nil {
		return fmt.Errorf("persist gossip keyring: %w", err)
	}
	return nil
}
