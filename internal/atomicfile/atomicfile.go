// Package atomicfile replaces a file's content so that a crash, at any
// instant, leaves either the old file or the new one whole under its name,
// never a torn or empty one, and so that a write reported done survives a
// power cut. The agent's epoch, the router's saved state, the gossip keyring,
// the control plane's snapshots and the certificates all need exactly that;
// the steps are in one place because a copy that skips one (the directory
// sync, the copies did) looks right and only fails after a crash.
//
// It is a leaf under internal/ (design §3): it imports no package of the
// repository, and it is the one helper the other leaves may import.
package atomicfile

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Write replaces path with data, with permissions perm: see WriteFunc.
func Write(path string, data []byte, perm os.FileMode) error {
	return WriteFunc(path, perm, func(w io.Writer) error {
		if _, err := w.Write(data); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		return nil
	})
}

// WriteFunc replaces path with what write writes, with permissions perm
// (umask does not apply), for callers that stream their content rather than
// hold it whole. The steps, each for a crash at a different moment:
//
//  1. The content goes to a temporary file in path's directory, never to
//     path itself: a crash mid-write leaves path as it was. The same
//     directory keeps the final rename on one filesystem, where it is
//     atomic.
//  2. The temporary file is fsynced before the rename: otherwise the rename
//     can reach the disk before the data, and a crash leaves path empty or
//     torn.
//  3. Its mode is set to perm before the rename, so path is never readable
//     more widely than perm, not even for an instant.
//  4. It is renamed over path: readers see the old file or the new one,
//     whole.
//  5. The directory is fsynced: the rename is a change to the directory, and
//     until that reaches the disk a crash can bring the old file back after
//     the write was reported done.
//
// When write or any step before the rename fails, the temporary file is
// removed and path is untouched. write's own error is returned as it is (it
// is the caller's, in the caller's words); the steps' errors name path.
func WriteFunc(path string, perm os.FileMode, write func(io.Writer) error) (err error) {
	dir := filepath.Dir(path)
	// Hidden, and named after its target, so a file left by a crash between
	// steps 1 and 4 says what it was for and is skipped by a glob on "*".
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	renamed := false
	defer func() {
		if !renamed {
			tmp.Close() // a second Close after a failed one only says it is closed
			os.Remove(tmp.Name())
		}
	}()
	if err := write(tmp); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("write %s: sync: %w", path, err)
	}
	if err := tmp.Chmod(perm); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: close: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	renamed = true
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("write %s: the new content is in place but may not survive a crash: %w", path, err)
	}
	return nil
}

// syncDir fsyncs directory dir, making the renames in it durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		d.Close()
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return d.Close()
}
