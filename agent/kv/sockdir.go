package kv

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// The agent's KV-event sockets are Unix sockets in one directory that only
// the agent's user may open (design §6 "KV events"): a Unix socket's file
// permissions are the only check the kernel makes on connect, and a
// directory of mode 0700 stops every other user before it, both from
// connecting to an engine's publisher or replay socket and from binding a
// socket of its own in an engine's place.

// SocketDir makes dir, the agent's socket directory, of mode 0700 and
// checks it: owned by this process's user, and no one else may enter or
// write it (an existing directory of a looser mode is tightened). A
// directory owned by anyone else is refused: its owner could swap the
// sockets.
func SocketDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("kv socket dir: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("kv socket dir: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("kv socket dir %s: not a directory", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("kv socket dir %s: owned by uid %d, not this agent's %d", dir, st.Uid, os.Geteuid())
	}
	if fi.Mode().Perm() != 0o700 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("kv socket dir: %w", err)
		}
	}
	return nil
}

// maxSocketPath is the longest path a Unix socket may have (sun_path is
// 108 bytes on Linux, with the terminating NUL).
const maxSocketPath = 107

// ErrSocketPathTooLong is IPCEndpoints' error for a directory too deep to
// hold a socket: the caller falls back to loopback TCP.
var ErrSocketPathTooLong = errors.New("socket path too long")

// IPCEndpoints are a replica's publisher and replay endpoints in the socket
// directory. The names are a digest of the replica id, short and fixed so
// that an agent restarted over a running engine finds its sockets again.
func IPCEndpoints(dir, replicaID string) (pub, replay string, err error) {
	sum := sha256.Sum256([]byte(replicaID))
	base := filepath.Join(dir, hex.EncodeToString(sum[:8]))
	pub, replay = base+".pub", base+".replay"
	if len(replay) > maxSocketPath {
		return "", "", fmt.Errorf("kv socket %s: %w (at most %d bytes)", replay, ErrSocketPathTooLong, maxSocketPath)
	}
	return "ipc://" + pub, "ipc://" + replay, nil
}
